"""From parsed arguments to what the library takes: the target, the memory budget, quiet."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import fields
from pathlib import Path

from attnaudit.attribution.options import AttributionOptions
from attnaudit.auditing.orchestration import attribution_of
from attnaudit.capturing.blocks import parse_memory
from attnaudit.errors import InterventionError, TargetError
from attnaudit.options import AttributionSettings, Loading
from attnaudit.targets.contract import Seq2SeqTarget
from attnaudit.targets.datafile import read_rows
from attnaudit.targets.hf.loading import from_hf
from attnaudit.targets.loading import load_target
from attnaudit.targets.placement import place

HF_ONLY = tuple(f.name for f in fields(Loading))


def load_cli_target(args: argparse.Namespace) -> Seq2SeqTarget:
    """The target named on the command line: TARGET, ``--hf DIR --data TSV``, or the date
    model; on ``--device`` in ``--dtype`` (the command's own copy of the model)."""
    _no_library_bars()
    if args.hf is not None:
        if args.target is not None:
            raise TargetError("give either TARGET or --hf DIR, not both")
        if args.data is None:
            raise TargetError("--hf DIR needs --data FILE.tsv (source[<TAB>target] lines)")
        loading = Loading(**{name: getattr(args, name) for name in HF_ONLY})
        contrast = read_contrast(args)
        return from_hf(args.hf, args.data, device=args.device, dtype=args.dtype,
                       contrast=contrast, **loading.given())
    if args.data is not None:
        raise TargetError("--data goes with --hf DIR")
    if getattr(args, "contrast", None) is not None:
        raise TargetError("--contrast goes with --hf DIR --data; a TARGET factory puts "
                          'contrast ids in batch.inputs["contrast_ids"] itself')
    for name in HF_ONLY:
        if getattr(args, name) is not None:
            raise TargetError(f"--{name.replace('_', '-')} goes with --hf DIR; a TARGET "
                              "factory batches and decodes its own way")
    # through the module, so that the factory loader can be swapped in tests
    return place(load_target(args.target), device=args.device, dtype=args.dtype)


def quiet(args: argparse.Namespace) -> bool:
    """Whether ``--quiet`` was given (before or after the command name)."""
    return getattr(args, "quiet", False)


def memory_option(args: argparse.Namespace) -> int | None:
    """``--max-memory`` in bytes (None when not given); a clear error when unreadable."""
    if args.max_memory is None:
        return None
    try:
        return parse_memory(args.max_memory)
    except ValueError as exc:
        raise InterventionError(f"--max-memory: {exc}") from exc


def _no_library_bars() -> None:
    """A command shows one progress display, its own: Hugging Face's bars (loading weights,
    downloads) stay off unless HF_HUB_DISABLE_PROGRESS_BARS=0 asks for them."""
    if os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1") == "1":
        hf_logging = sys.modules.get("transformers.utils.logging")
        if hf_logging is not None:  # imported before the variable was set
            hf_logging.disable_progress_bar()


def read_contrast(args: argparse.Namespace) -> list[str] | None:
    """``--contrast FILE``: one contrast output per line, aligned with the data's sources
    (its non-blank lines); a blank line before the last contrast is refused, since it would
    shift every later contrast onto another source."""
    path = getattr(args, "contrast", None)
    if path is None:
        return None
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TargetError(f"--contrast {path}: {exc}") from None
    while lines and not lines[-1].strip():
        lines.pop()
    blank = next((n for n, line in enumerate(lines, start=1) if not line.strip()), None)
    if blank is not None:
        raise TargetError(f"--contrast {path}, line {blank}: blank; give one contrast output "
                          "per source of --data, in order, with no blank lines (or put the "
                          "contrasts in a third column of --data)")
    return lines


def check_contrast(args: argparse.Namespace) -> None:
    """A contrast ``--attribute`` needs contrast outputs: ``--contrast`` or a third column
    in ``--data`` (checked before the target loads)."""
    if (args.attribute.startswith("contrast") and args.contrast is None and args.hf is not None
            and args.data is not None and read_rows(args.data).contrasts is None):
        raise TargetError(f"--attribute {args.attribute} needs --contrast FILE or a third "
                          f"column (contrast) in {args.data}")


def attribution_option(args: argparse.Namespace) -> AttributionOptions:
    """``--attribute``, ``--attribution-variant``, ``--target-side`` and ``--methods`` as
    options (what the audit makes of the same settings)."""
    check_contrast(args)
    return attribution_of(AttributionSettings(args.attribute, args.attribution_variant,
                                              args.target_side, args.methods))
