"""The command line proper: the parser, and running one command under signals and torchrun.

Imported by :func:`attnaudit.cli.main` when a command runs; it brings in every library the
commands use (captum, seaborn, ...).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import traceback
import warnings
from collections.abc import Callable
from importlib.metadata import version
from typing import NoReturn, TextIO

from attnaudit.attribution.options import ALL_METHODS
from attnaudit.attribution.step_gradients import OUTPUTS
from attnaudit.auditing.intervention_suite import QUICK_PERMUTATIONS
from attnaudit.cli.align import add_align_arguments, align_command
from attnaudit.cli.commands import check_command, demo_command, intervene_command, report_command
from attnaudit.cli.exits import INTERRUPTED, USAGE_ERROR
from attnaudit.cli.loading import name_list
from attnaudit.errors import AttnauditError, Terminated
from attnaudit.interventions.permutation import N_PERMUTATIONS
from attnaudit.report.explorer import DEFAULT_EXAMPLES
from attnaudit.runtime.distributed import launched_by_torchrun, main_rank_output, torchrun_session
from attnaudit.targets.decoding import DECODING_MODES
from attnaudit.validity.analysers import DEFAULT_MAX_MASKED_MASS, DEFAULT_ROW_SUM_TOLERANCE

DESCRIPTION = ("Audit the attention of a sequence-to-sequence model: capture its attention "
               "weights, check that they are a valid weighted retrieval, intervene on them "
               "inside the forward pass, and report what they do and do not explain. "
               "TARGET defaults to the bundled date model.")
EPILOG = ("Run 'attnaudit COMMAND --help' for a command's options. Progress goes to stderr "
          "(whole lines when stderr is not a terminal; none with --quiet); results go to "
          "stdout.")
QUICK_HELP = (f"a cheaper audit: no adversarial search, no integrated gradients (unless "
              f"--methods names them), "
              f"{QUICK_PERMUTATIONS} permutations per row instead of {N_PERMUTATIONS}")


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated


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


def _add_target_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", nargs="?", metavar="TARGET",
                        help="package.module:factory or path/to/file.py:factory returning a "
                             "Seq2SeqTarget (default: the bundled date model)")
    parser.add_argument("--hf", metavar="DIR",
                        help="a local Hugging Face checkpoint: seq2seq, or a decoder-only LM "
                             "(prompt -> continuation)")
    parser.add_argument("--data", metavar="FILE.tsv",
                        help="with --hf: source[<TAB>target] lines to audit")
    parser.add_argument("--limit", type=positive_int, metavar="N",
                        help="audit only the first N examples")
    parser.add_argument("--device", metavar="DEV",
                        help="run the model on DEV: cpu, cuda, cuda:N, mps (default: where "
                             "the target puts it)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                        help="cast the model's floating parameters to this dtype")
    parser.add_argument("--batch-size", type=positive_int, metavar="N",
                        help="with --hf: examples per batch (default 100)")
    parser.add_argument("--max-new-tokens", type=positive_int, metavar="N",
                        help="with --hf: decoding limit (default: the model's generation "
                             "config's, else 64)")
    parser.add_argument("--decoding", choices=list(DECODING_MODES),
                        help="with --hf: model: decode with the model's generation config "
                             "(beams, length penalty, limits ...; the default); greedy: one "
                             "hypothesis, the argmax at every step")
    parser.add_argument("--num-beams", type=positive_int, metavar="N",
                        help="with --hf: beam search with N beams (overrides the model's "
                             "generation config)")
    parser.add_argument("--seed", type=int, metavar="N",
                        help="with --hf: seed for a decoding that samples (refused without "
                             "one)")
    parser.add_argument("--max-source-tokens", type=positive_int, metavar="N",
                        help="with --hf: truncate longer sources (default: the model's "
                             "position limit), with a warning")


def _add_output_arguments(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument("--out", required=required, metavar="DIR",
                        help="output folder: created if missing; a previous attnaudit output "
                             "there is replaced whole, only once the new one is complete")
    parser.add_argument("--force", action="store_true",
                        help="replace DIR even when it holds files that are not an attnaudit "
                             "output (they are deleted)")


def _add_memory_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-memory", metavar="SIZE",
                        help="memory budget of one chunk of edited sequences and of one "
                             "query block of explicitly computed attention, e.g. 2GiB, "
                             "512MB (default 1GiB)")


def _add_sequence_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sequence-effects", action="store_true",
                        help="also decode each source again with the uniform, zeroing and "
                             "median permutation edits held at every step, and report whether "
                             "the returned text changed (exact match, token edit distance)")


def _add_attribution_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--attribute", choices=list(OUTPUTS), default="prob",
                        help="what gradient attributions explain (default prob; entropy: "
                             "of the output distribution; contrast: "
                             "p(output) - p(contrast token), contrast_logit: the logit "
                             "difference)")
    parser.add_argument("--contrast", metavar="FILE",
                        help="with --hf: one contrast output per line, aligned with --data's "
                             "sources (or give source<TAB>target<TAB>contrast lines in --data)")
    parser.add_argument("--attribution-variant", choices=["attnaudit", "inseq"],
                        default="attnaudit",
                        help="attnaudit: signed sums, pad baseline, attention held constant "
                             "for saliency and input x gradient (default); inseq: L2 norm "
                             "over the embedding, <unk> baseline, gradients through attention")
    parser.add_argument("--target-side", action="store_true",
                        help="attribute to the output prefix as well as to the source")
    parser.add_argument("--methods", type=name_list(ALL_METHODS, "methods"),
                        metavar="M[,M...]",
                        help="attribution methods to run, among " + ", ".join(ALL_METHODS)
                             + " (default: saliency, input_x_gradient and, unless --quick, "
                               "integrated_gradients)")


def build_parser() -> argparse.ArgumentParser:
    debug = Parser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show the Python traceback of an error")
    debug.add_argument("--quiet", action="store_true", default=argparse.SUPPRESS,
                       help="no progress display on stderr (warnings and errors still show)")
    parser = Parser(prog="attnaudit", description=DESCRIPTION, epilog=EPILOG,
                    parents=[debug])
    parser.add_argument("--version", action="version", version=version("attnaudit"))
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", parents=[debug],
                               help="capture the bundled date model's attention")
    demo.set_defaults(run=demo_command)

    check = commands.add_parser(
        "check", parents=[debug],
        help="CI gate: exit 1 on non-finite weights, leaked mask mass, bad row sums")
    _add_target_arguments(check)
    _add_memory_argument(check)
    check.add_argument("--max-masked-mass", type=float, default=DEFAULT_MAX_MASKED_MASS,
                       help="largest tolerated weight on an ineligible key (default %(default)g)")
    check.add_argument("--row-sum-tolerance", type=float, default=DEFAULT_ROW_SUM_TOLERANCE,
                       help="largest tolerated |row sum - 1| (default: from the weights' "
                            "dtype and key count, 1e-3 for float32; see the README)")
    check.add_argument("--json", action="store_true", help="print the result as JSON")
    check.add_argument("--junit", metavar="FILE", help="also write JUnit XML to FILE")
    check.set_defaults(run=check_command)

    intervene = commands.add_parser(
        "intervene", parents=[debug],
        help="run the intervention and attribution suite and print its tables")
    _add_target_arguments(intervene)
    _add_output_arguments(intervene, required=False)
    intervene.add_argument("--quick", action="store_true", help=QUICK_HELP)
    intervene.add_argument("--site", action="append", metavar="NAME",
                           help="edit only this site (repeatable; default: every "
                                "cross-attention site)")
    intervene.add_argument("--head", action="append", type=int, metavar="N",
                           help="edit only this head at each edited site (repeatable)")
    _add_memory_argument(intervene)
    _add_sequence_argument(intervene)
    _add_attribution_arguments(intervene)
    intervene.set_defaults(run=intervene_command)

    align = commands.add_parser(
        "align", parents=[debug],
        help="word alignments (Pharaoh) from attention or another measure; AER with --gold")
    _add_target_arguments(align)
    _add_memory_argument(align)
    add_align_arguments(align)
    align.set_defaults(run=align_command)

    report = commands.add_parser("report", parents=[debug], help="write an HTML/CSV audit report")
    _add_target_arguments(report)
    _add_output_arguments(report, required=True)
    report.add_argument("--quick", action="store_true", help=QUICK_HELP)
    report.add_argument("--explorer-examples", type=positive_int, metavar="N",
                        default=DEFAULT_EXAMPLES,
                        help="the attention explorer shows the first N examples' maps "
                             "(default %(default)s)")
    _add_memory_argument(report)
    _add_sequence_argument(report)
    _add_attribution_arguments(report)
    report.set_defaults(run=report_command)
    return parser


def run(argv: list[str] | None = None) -> int:
    """:func:`attnaudit.cli.main` once the command's libraries are importable."""
    status = _run_command(argv)
    if argv is None and launched_by_torchrun():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


def _run_command(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    debug = getattr(args, "debug", False)
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if in_main_thread else None
    try:
        with warnings.catch_warnings(), torchrun_session() as shard, main_rank_output(shard):
            warnings.showwarning = _warning_line(args.command)
            return args.run(args)
    except KeyboardInterrupt as exc:
        what = "terminated" if isinstance(exc, Terminated) else "interrupted"
        print(f"attnaudit {args.command}: {what}; an output folder is replaced only by a "
              "complete run", file=sys.stderr)
        return INTERRUPTED
    except Exception as exc:
        if debug:
            traceback.print_exc()
        print(f"attnaudit {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return USAGE_ERROR
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


def _warning_line(command: str) -> Callable[..., None]:
    """A ``warnings.showwarning`` that prints ``attnaudit CMD: warning: message`` as one
    line on stderr: the user acts on the message, not on the source line that raised it."""

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: TextIO | None = None, line: str | None = None) -> None:
        text = " ".join(str(message).split()).removeprefix("attnaudit: ")
        print(f"attnaudit {command}: warning: {text}", file=file or sys.stderr)

    return show


def _one_line(exc: Exception) -> str:
    """An attnaudit error's own message; anything else with its type, and how to see more."""
    message = " ".join(str(exc).split())
    if isinstance(exc, AttnauditError):
        return message
    return (f"{type(exc).__name__}: {message} (an unexpected error; run again with --debug "
            "for the traceback)")
