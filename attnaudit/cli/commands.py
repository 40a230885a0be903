"""The subcommands: ``check``, ``report``, ``intervene`` and ``demo``. Each loads its target,
asks the library, and prints; each returns the exit status."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from attnaudit.auditing.intervention_suite import InterventionSuite
from attnaudit.auditing.orchestration import audit, intervene, plan
from attnaudit.cli.display import print_suite
from attnaudit.cli.exits import INCOMPLETE
from attnaudit.cli.loading import check_contrast, load_cli_target, quiet
from attnaudit.cli.settings import audit_options
from attnaudit.errors import GateError
from attnaudit.options import DEFAULT_EXPLORER_EXAMPLES, AuditMode
from attnaudit.report.manifest import library_versions
from attnaudit.runtime.distributed import Shard, current_shard
from attnaudit.runtime.output_folder import OutputFolder, check_output_file
from attnaudit.targets.loading import require_bundled_examples


def demo_command(args: argparse.Namespace) -> int:
    """``attnaudit demo``: the bundled date model's capture (``attnaudit_examples.date.demo``)."""
    require_bundled_examples()
    from attnaudit_examples.date.demo import main as demo_main

    demo_main(progress=not quiet(args))
    return 0


def check_command(args: argparse.Namespace) -> int:
    """``attnaudit check``: the gate's checks only; 0 healthy, 1 failing (see the README)."""
    options = audit_options(args, AuditMode.CHECKS)  # bad values fail before any work
    if args.junit is not None and not args.dry_run:
        check_output_file(args.junit, "JUnit XML")  # before the audit, not after it
    started = time.perf_counter()
    if not quiet(args):
        print("attnaudit check: loading the target", file=sys.stderr, flush=True)
    target = load_cli_target(args)
    if args.dry_run:
        print(plan(target, options=options))
        return 0
    result = audit(target, options=options, progress=not quiet(args)).gate()
    shard = current_shard()
    with shard.together("writing the JUnit XML"):
        if args.junit and shard.is_main:
            path = Path(args.junit)
            try:
                path.write_text(result.junit_xml(time.perf_counter() - started),
                                encoding="utf-8")
            except OSError as exc:
                raise GateError(f"cannot write JUnit XML to {path}: "
                                f"{exc.strerror or exc}") from exc
    print(result.to_json() if args.json else result.summary())
    return result.status


def report_command(args: argparse.Namespace) -> int:
    """``attnaudit report``: the whole audit, written to ``--out``; prints the page's path.
    Exits :data:`INCOMPLETE` when the intervention suite could not run (the page says why)."""
    options = audit_options(args)
    check_contrast(args)
    if args.dry_run:
        print(plan(load_cli_target(args), options=options))
        return 0
    OutputFolder.check(args.out, force=args.force)  # before the target loads
    target = load_cli_target(args)
    result = audit(target, options=options, progress=not quiet(args),
                   command_line=report_command_line(args))
    shard = current_shard()
    with shard.together("writing the report"):
        if shard.is_main:  # rank 0 alone writes; the others wait for it to finish
            print(f"attnaudit report: wrote {result.save(args.out, force=args.force)}")
    if result.suite is None:
        print(f"attnaudit report: incomplete: {result.suite_reason}", file=sys.stderr)
        return INCOMPLETE
    return 0


def report_command_line(args: argparse.Namespace) -> list[str]:
    """The ``attnaudit report`` command that reproduces this run, from parsed arguments."""
    words = ["attnaudit", "report"]
    if args.target is not None:
        words.append(args.target)
    for flag, value in (("--hf", args.hf), ("--data", args.data), ("--limit", args.limit),
                        ("--device", args.device), ("--dtype", args.dtype),
                        ("--batch-size", args.batch_size),
                        ("--max-new-tokens", args.max_new_tokens),
                        ("--max-source-tokens", args.max_source_tokens),
                        ("--decoding", args.decoding), ("--num-beams", args.num_beams),
                        ("--seed", args.seed),
                        ("--max-memory", args.max_memory), ("--contrast", args.contrast),
                        ("--gold", args.gold)):
        if value is not None:
            words += [flag, str(value)]
    if args.explorer_examples != DEFAULT_EXPLORER_EXAMPLES:
        words += ["--explorer-examples", str(args.explorer_examples)]
    for flag, values in (("--site", args.sites), ("--head", args.heads)):
        for value in values or ():
            words += [flag, str(value)]
    if args.attribute != "prob":
        words += ["--attribute", args.attribute]
    if args.attribution_variant != "attnaudit":
        words += ["--attribution-variant", args.attribution_variant]
    if args.methods is not None:
        words += ["--methods", ",".join(args.methods)]
    words += ["--out", str(args.out)]
    words += [flag for flag, given in (("--quick", args.quick), ("--force", args.force),
                                       ("--target-side", args.target_side),
                                       ("--sequence-effects", args.sequence_effects)) if given]
    return words


def intervene_command(args: argparse.Namespace) -> int:
    """``attnaudit intervene``: run the suite, print its summaries, write CSVs to --out."""
    options = audit_options(args)
    check_contrast(args)
    folder = (None if args.out is None or args.dry_run
              else OutputFolder.check(args.out, force=args.force))
    shard = current_shard()
    args.device = shard.device(args.device)  # cuda:LOCAL_RANK under torchrun with nccl
    target = load_cli_target(args)
    if args.dry_run:
        print(plan(target, options=options))
        return 0
    suite = intervene(target, options=options, progress=not quiet(args))
    print_suite(suite)
    with shard.together("writing the tables"):
        if folder is not None and shard.is_main:
            with folder.assembling() as out:
                paths = suite.write_csv(out)
                _write_suite_manifest(suite, out, shard)
            print(f"\nwrote {len(paths)} tables to {folder.path}")
    return 0


def _write_suite_manifest(suite: InterventionSuite, out: Path, shard: Shard) -> None:
    """``out/manifest.json``: the suite's metadata, table names and library versions (it
    also marks the folder as an attnaudit output, :mod:`attnaudit.runtime.output_folder`)."""
    manifest = {"target": suite.metadata.get("target"), "command": "attnaudit intervene",
                "tables": sorted(suite.tables), "metadata": suite.metadata,
                "distributed": shard.describe(), "libraries": library_versions()}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str) + "\n",
                                       encoding="utf-8")
