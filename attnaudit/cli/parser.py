"""The ``attnaudit`` command's parser, torch-free: ``--help``, ``--version`` and usage
errors answer without importing the library (tests/cli/test_fast_help.py).

A flag that sets an audit setting is named after its field of
:class:`attnaudit.options.AuditOptions` (:func:`attnaudit.options.flag_of`) and parsed
into an attribute of that name, so that :func:`attnaudit.cli.settings.audit_options` reads
them by name; the other flags belong to one command (``--out``, ``--json``, ``--gold``...).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from importlib.metadata import version
from typing import Any, NoReturn

from attnaudit.cli.exits import USAGE_ERROR
from attnaudit.options import (
    ALIGNMENT_COMBINED,
    ALIGNMENT_CONVENTIONS,
    ALIGNMENT_MEASURES,
    ALIGNMENT_UNITS,
    ATTRIBUTION_METHODS,
    ATTRIBUTION_OUTPUTS,
    ATTRIBUTION_VARIANTS,
    DECODING_MODES,
    DEFAULT_EXPLORER_EXAMPLES,
    DEFAULT_MAX_MASKED_MASS,
    DEFAULT_ROW_SUM_TOLERANCE,
    DTYPES,
    N_PERMUTATIONS,
    QUICK_PERMUTATIONS,
    WORK_BUDGET,
    flag_of,
)

DESCRIPTION = ("Audit the attention of a sequence-to-sequence model: capture its attention "
               "weights, check that they are a valid weighted retrieval, intervene on them "
               "inside the forward pass, and report what they do and do not explain. "
               "TARGET defaults to the bundled date model.")
EPILOG = ("Run 'attnaudit COMMAND --help' for a command's options. Progress goes to stderr "
          "(whole lines when stderr is not a terminal; none with --quiet); results go to "
          "stdout. Exit status: 0 done, 1 check failed, 2 a user error, 3 report "
          "incomplete, 4 a bug in attnaudit, 130 interrupted.")
QUICK_HELP = (f"a cheaper audit: no adversarial search, no integrated gradients (unless "
              f"--methods names them), "
              f"{QUICK_PERMUTATIONS} permutations per row instead of {N_PERMUTATIONS}")
ALL = "all"  # align: every layer or convention, in an AER table
ALIGNMENTS_FILE = "alignments.txt"  # what align --out DIR/ writes inside DIR


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line naming where to read more."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (``--limit 0`` would audit nothing)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def work_budget(text: str) -> float:
    """argparse type: a number of multiply-adds > 0, or ``none`` (no budget)."""
    if text.strip().lower() in ("none", "inf"):
        return math.inf
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of multiply-adds such as 1e13, "
                                         f"or none, got {text!r}") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def head_index(text: str) -> int:
    """argparse type: a head index >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a head index, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def name_list(allowed: tuple[str, ...], what: str) -> Callable[[str], tuple[str, ...]]:
    """An argparse type for ``--option a,b``: distinct names among ``allowed`` (``what``
    names them in the message)."""
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(m.strip() for m in text.split(",") if m.strip())
        unknown = [m for m in names if m not in allowed]
        if unknown or not names or len(set(names)) != len(names):
            raise argparse.ArgumentTypeError(f"give distinct {what} among "
                                             f"{', '.join(allowed)}, got {text!r}")
        return names
    return parse


def _setting(parser: argparse.ArgumentParser, name: str, **kwargs: Any) -> None:
    """The flag of the audit setting ``name``, parsed into ``args.<name>``."""
    parser.add_argument(flag_of(name), dest=name, **kwargs)


def _add_target_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", nargs="?", metavar="TARGET",
                        help="package.module:factory or path/to/file.py:factory returning a "
                             "Seq2SeqTarget (default: the bundled date model)")
    parser.add_argument("--hf", metavar="DIR",
                        help="a local Hugging Face checkpoint: seq2seq, or a decoder-only LM "
                             "(prompt -> continuation)")
    parser.add_argument("--data", metavar="FILE.tsv",
                        help="with --hf: source[<TAB>target] lines to audit")
    _setting(parser, "limit", type=positive_int, metavar="N",
             help="audit only the first N examples")
    _setting(parser, "device", metavar="DEV",
             help="run the model on DEV: cpu, cuda, cuda:N, mps (default: where the target "
                  "puts it)")
    _setting(parser, "dtype", choices=list(DTYPES),
             help="cast the model's floating parameters to this dtype")
    _setting(parser, "batch_size", type=positive_int, metavar="N",
             help="with --hf: examples per batch (default 100)")
    _setting(parser, "max_new_tokens", type=positive_int, metavar="N",
             help="with --hf: decoding limit (default: the model's generation config's, "
                  "else 64)")
    _setting(parser, "decoding", choices=list(DECODING_MODES),
             help="with --hf: model: decode with the model's generation config (beams, "
                  "length penalty, limits ...; the default); greedy: one hypothesis, the "
                  "argmax at every step")
    _setting(parser, "num_beams", type=positive_int, metavar="N",
             help="with --hf: beam search with N beams (overrides the model's generation "
                  "config)")
    _setting(parser, "seed", type=int, metavar="N",
             help="with --hf: seed for a decoding that samples (refused without one)")
    _setting(parser, "max_source_tokens", type=positive_int, metavar="N",
             help="with --hf: truncate longer sources (default: the model's position "
                  "limit), with a warning")


def _add_output_arguments(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument("--out", required=required, metavar="DIR",
                        help="output folder: created if missing; a previous attnaudit output "
                             "there is replaced whole, only once the new one is complete")
    parser.add_argument("--force", action="store_true",
                        help="replace DIR even when it holds files that are not an attnaudit "
                             "output (they are deleted)")


def _add_dry_run_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan alone: passes and edited items per protocol and "
                             "an estimate from a timed first batch; run no audit")


def _add_memory_argument(parser: argparse.ArgumentParser) -> None:
    _setting(parser, "max_memory", metavar="SIZE",
             help="memory budget of one chunk of edited sequences and of one query block of "
                  "explicitly computed attention, e.g. 2GiB, 512MB (default 1GiB)")


def _add_edit_arguments(parser: argparse.ArgumentParser) -> None:
    _setting(parser, "sites", action="append", metavar="NAME",
             help="edit only this site (repeatable; default: every cross-attention site, a "
                  "decoder-only model's self-attention)")
    _setting(parser, "heads", action="append", type=head_index, metavar="N",
             help="edit only this head at each edited site (repeatable)")
    _setting(parser, "sequence_effects", action="store_true",
             help="also decode each source again with the uniform, zeroing and median "
                  "permutation edits held at every step, and report whether the returned "
                  "text changed (exact match, token edit distance)")


def _add_attribution_variant(parser: argparse.ArgumentParser, help: str) -> None:
    _setting(parser, "attribution_variant", choices=list(ATTRIBUTION_VARIANTS),
             default="attnaudit", help=help)


def _add_attribution_arguments(parser: argparse.ArgumentParser) -> None:
    _setting(parser, "attribute", choices=list(ATTRIBUTION_OUTPUTS), default="prob",
             help="what gradient attributions explain (default prob; entropy: of the output "
                  "distribution; contrast: p(output) - p(contrast token), contrast_logit: "
                  "the logit difference)")
    parser.add_argument("--contrast", metavar="FILE",
                        help="with --hf: one contrast output per line, aligned with --data's "
                             "sources (or give source<TAB>target<TAB>contrast lines in --data)")
    _add_attribution_variant(
        parser, "attnaudit: signed sums, pad baseline, attention held constant for saliency "
                "and input x gradient (default); inseq: L2 norm over the embedding, <unk> "
                "baseline, gradients through attention")
    _setting(parser, "target_side", action="store_true",
             help="attribute to the output prefix as well as to the source")
    _setting(parser, "methods", type=name_list(ATTRIBUTION_METHODS, "methods"),
             metavar="M[,M...]",
             help="attribution methods to run, among " + ", ".join(ATTRIBUTION_METHODS)
                  + " (default: saliency, input_x_gradient and, unless --quick, "
                    "integrated_gradients)")


def _add_suite_arguments(parser: argparse.ArgumentParser) -> None:
    """What ``report`` and ``intervene`` share: the mode, the edits, the attribution."""
    parser.add_argument("--quick", action="store_true", help=QUICK_HELP)
    _add_edit_arguments(parser)
    _add_memory_argument(parser)
    _setting(parser, "work_budget", type=work_budget, default=WORK_BUDGET,
             metavar="MULTIPLY_ADDS",
             help="multiply-adds (parameters x tokens) each of the costliest protocols may "
                  "spend per example before it runs less of its work: integrated gradients' "
                  "points, the adversarial search's steps, leave-one-out's edits, value "
                  f"zeroing, the faithfulness rows (default {WORK_BUDGET:.0e}; none: no "
                  "budget; binds from about 10M parameters on)")
    _add_attribution_arguments(parser)


def _layer(text: str) -> int | str:
    if text in (ALIGNMENT_COMBINED, ALL):
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a layer index, {ALIGNMENT_COMBINED} or "
                                         f"{ALL}, got {text!r}") from None


def _add_align_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``attnaudit align`` beyond the target's."""
    weights = ALIGNMENT_MEASURES[0]
    parser.add_argument("--measure", type=name_list(ALIGNMENT_MEASURES, "measures"),
                        default=(weights,), metavar="M[,M...]",
                        help=f"what to align from, among {', '.join(ALIGNMENT_MEASURES)} "
                             f"(default {weights}); several need --gold")
    parser.add_argument("--layer", type=_layer, default=ALIGNMENT_COMBINED,
                        metavar=f"N|{ALIGNMENT_COMBINED}|{ALL}",
                        help="the measure's layer (0-based), mean: the mean over its layers "
                             "(default), all: each layer and the mean (needs --gold)")
    parser.add_argument("--convention", choices=[*ALIGNMENT_CONVENTIONS, ALL], default="emit",
                        help="output token j is read at the step that emits it (emit, "
                             "default) or where it is the decoder input (input); all: both "
                             "(needs --gold)")
    parser.add_argument("--units", choices=ALIGNMENT_UNITS, default="words",
                        help="words: subwords merged into words (default); tokens: every "
                             "eligible source token and output token")
    parser.add_argument("--out", metavar="DIR/|FILE",
                        help="write the Pharaoh alignments (i-j: source word i, target word "
                             f"j) into DIR/{ALIGNMENTS_FILE} (an existing folder, or a path "
                             "ending in /, created if missing), or to FILE (default: stdout, "
                             "unless --gold)")
    parser.add_argument("--gold", metavar="FILE",
                        help="gold alignments, one Pharaoh line per example (i-j sure, i-pj "
                             "possible): print AER, precision and recall")
    _add_attribution_variant(parser, "variant of the gradient measures (see attnaudit "
                                     "intervene)")


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The parsed command line; a usage error also for ``report`` with neither ``--out`` nor
    ``--dry-run`` (``--out`` is optional only for the plan alone), and for ``check`` with
    ``--json`` and ``--dry-run`` (the plan is text: no check result to print as JSON)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "report" and args.out is None and not args.dry_run:
        parser.error("report writes a folder: give --out DIR (or --dry-run for the plan "
                     "alone)")
    if args.command == "check" and args.json and args.dry_run:
        parser.error("--json prints a check's result and --dry-run runs no check: give one "
                     "of them")
    return args


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command; ``args.command`` names the one given."""
    common = Parser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the Python traceback of an error")
    common.add_argument("--quiet", action="store_true", default=argparse.SUPPRESS,
                        help="no progress display on stderr (warnings and errors still show)")
    parser = Parser(prog="attnaudit", description=DESCRIPTION, epilog=EPILOG,
                    parents=[common])
    parser.add_argument("--version", action="version", version=version("attnaudit"))
    commands = parser.add_subparsers(dest="command", required=True)

    demo_help = "capture the bundled date model's attention"
    commands.add_parser("demo", parents=[common], help=demo_help,
                        description=f"{demo_help[0].upper()}{demo_help[1:]} (an LSTM "
                        "normalising English dates) while it decodes 400 validation dates: "
                        "what capture saw, the masked mass on padding, the seed's "
                        "year-alignment numbers beside attnaudit's, and one example as a text "
                        "heatmap. It takes no target and downloads nothing.")

    check_help = "CI gate: exit 1 on non-finite weights, leaked mask mass, bad row sums"
    check = commands.add_parser("check", parents=[common], help=check_help,
                                description=f"{check_help}; exit 0 when every attention site "
                                "is healthy.")
    _add_target_arguments(check)
    _add_memory_argument(check)
    _setting(check, "max_masked_mass", type=float, default=DEFAULT_MAX_MASKED_MASS,
             metavar="MASS",
             help="largest tolerated weight on an ineligible key (default %(default)g)")
    _setting(check, "row_sum_tolerance", type=float, default=DEFAULT_ROW_SUM_TOLERANCE,
             metavar="TOL",
             help="largest tolerated |row sum - 1| (default: from the weights' dtype and key "
                  "count, 1e-3 for float32; see Tolerances in the docs' gate page, "
                  "docs/gate.md)")
    _add_dry_run_argument(check)
    check.add_argument("--json", action="store_true", help="print the result as JSON")
    check.add_argument("--junit", metavar="FILE", help="also write JUnit XML to FILE")

    intervene_help = "run the intervention and attribution suite and print its tables"
    intervene = commands.add_parser("intervene", parents=[common], help=intervene_help,
                                    description=f"{intervene_help.capitalize()} (with --out, "
                                    "also write them as CSVs).")
    _add_target_arguments(intervene)
    _add_output_arguments(intervene, required=False)
    _add_suite_arguments(intervene)
    _add_dry_run_argument(intervene)

    align_help = ("word alignments (Pharaoh) from attention or another measure; AER with "
                  "--gold")
    align = commands.add_parser("align", parents=[common], help=align_help,
                                description=align_help[0].upper() + align_help[1:] + ".")
    _add_target_arguments(align)
    _add_memory_argument(align)
    _add_align_arguments(align)

    report_help = "write an HTML/CSV audit report"
    report = commands.add_parser("report", parents=[common], help=report_help,
                                 description=f"{report_help.capitalize()} into --out: the "
                                 "checklist, its evidence tables and the attention explorer.")
    _add_target_arguments(report)
    _add_output_arguments(report, required=False)
    _add_suite_arguments(report)
    _add_dry_run_argument(report)
    _setting(report, "explorer_examples", type=positive_int, metavar="N",
             default=DEFAULT_EXPLORER_EXAMPLES,
             help="the attention explorer shows the first N examples' maps (default "
                  "%(default)s)")
    _setting(report, "gold", metavar="FILE",
             help="gold alignments, one Pharaoh line per example in token units (i-j sure, "
                  "i-pj possible): the report's alignment error rate table for any model")
    return parser
