"""``attnaudit align``: Pharaoh word alignments of a target's data from any measure, and
their AER against a gold file (docs/alignments.md)."""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from attnaudit.alignments.aer import count_links
from attnaudit.alignments.maps import COMBINED, MEASURES, WEIGHTS
from attnaudit.alignments.pharaoh import read_alignments, write_alignments
from attnaudit.alignments.run import aer_table, align
from attnaudit.alignments.units import CONVENTIONS, UNITS
from attnaudit.attribution.options import AttributionOptions
from attnaudit.cli.loading import load_cli_target, memory_option, name_list
from attnaudit.errors import AlignmentError

ALL = "all"


def add_align_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``attnaudit align`` beyond the target's."""
    parser.add_argument("--measure", type=name_list(MEASURES, "measures"), default=(WEIGHTS,),
                        metavar="M[,M...]",
                        help=f"what to align from, among {', '.join(MEASURES)} (default "
                             f"{WEIGHTS}); several need --gold")
    parser.add_argument("--layer", type=_layer, default=COMBINED, metavar="N|mean|all",
                        help="the measure's layer (0-based), mean: the mean over its layers "
                             "(default), all: each layer and the mean (needs --gold)")
    parser.add_argument("--convention", choices=[*CONVENTIONS, ALL], default="emit",
                        help="output token j is read at the step that emits it (emit, "
                             "default) or where it is the decoder input (input); all: both "
                             "(needs --gold)")
    parser.add_argument("--units", choices=UNITS, default="words",
                        help="words: subwords merged into words (default); tokens: every "
                             "eligible source token and output token")
    parser.add_argument("--out", metavar="FILE",
                        help="write the Pharaoh alignments (i-j: source word i, target word "
                             "j) to FILE (default: stdout, unless --gold)")
    parser.add_argument("--gold", metavar="FILE",
                        help="gold alignments, one Pharaoh line per example (i-j sure, i-pj "
                             "possible): print AER, precision and recall")
    parser.add_argument("--attribution-variant", choices=["attnaudit", "inseq"],
                        default="attnaudit",
                        help="variant of the gradient measures (see attnaudit intervene)")


def _layer(text: str) -> int | str:
    if text in (COMBINED, ALL):
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a layer index, {COMBINED} or {ALL}, got "
                                         f"{text!r}") from None


def align_command(args: argparse.Namespace) -> int:
    """Write one setting's alignments, or print the AER of every setting asked for."""
    conventions = list(CONVENTIONS) if args.convention == ALL else [args.convention]
    several = len(args.measure) > 1 or args.layer == ALL or len(conventions) > 1
    if several and args.gold is None:
        raise AlignmentError("several measures, layers or conventions make a table of AER "
                             "values: give --gold FILE, or one of each to write alignments")
    if several and args.out is not None:
        raise AlignmentError("--out writes the alignments of one measure, layer and "
                             "convention; drop it to print the AER table")
    gold = None if args.gold is None else read_alignments(args.gold)
    max_memory = memory_option(args)
    options = AttributionOptions.variant(args.attribution_variant)
    target = load_cli_target(args)
    if several:
        table = aer_table(target, gold, args.measure, units=args.units, conventions=conventions,
                          layer=None if args.layer == ALL else args.layer, limit=args.limit,
                          attribution=options, max_memory=max_memory)
        with pd.option_context("display.width", 200, "display.max_rows", None):
            print(table.round(4).to_string(index=False))
        return 0
    links = align(target, args.measure[0], args.layer, units=args.units,
                  convention=conventions[0], limit=args.limit, attribution=options,
                  max_memory=max_memory)
    if args.out is not None:
        print(f"attnaudit align: wrote {write_alignments(args.out, links)}", file=sys.stderr)
    elif gold is None:
        sys.stdout.write("".join(a.to_line() + "\n" for a in links))
    if gold is not None:
        if args.limit is not None:
            gold = gold[:len(links)]
        counts = count_links(links, gold)
        print(f"{args.measure[0]} layer {args.layer} ({conventions[0]}, {args.units}): "
              f"AER {_fmt(counts.aer)}  precision {_fmt(counts.precision)}  recall "
              f"{_fmt(counts.recall)}  ({counts.sentences} sentences, {counts.predicted} links, "
              f"{counts.sure} sure gold links)")
    return 0


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"
