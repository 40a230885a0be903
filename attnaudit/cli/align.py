"""``attnaudit align``: Pharaoh word alignments of a target's data from any measure, and
their AER against a gold file (docs/alignments.md)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pandas as pd

from attnaudit.alignments.aer import count_links
from attnaudit.alignments.pharaoh import read_alignments, write_alignments
from attnaudit.alignments.run import aer_table, align
from attnaudit.alignments.units import CONVENTIONS
from attnaudit.attribution.options import AttributionOptions
from attnaudit.cli.loading import load_cli_target, memory_option
from attnaudit.cli.parser import ALIGNMENTS_FILE, ALL
from attnaudit.errors import AlignmentError


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
        assert gold is not None  # several settings without --gold were refused above
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
        path = alignments_path(args.out)
        print(f"attnaudit align: wrote {write_alignments(path, links)}", file=sys.stderr)
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


def alignments_path(out: str) -> Path:
    """``--out``: a folder (one that exists, or a path ending in a separator, created)
    takes :data:`ALIGNMENTS_FILE`, as every other ``--out`` is a folder; else the file."""
    path = Path(out)
    if path.is_dir() or out.endswith((os.sep, "/")):
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise AlignmentError(f"--out {out}: cannot create the folder: "
                                 f"{exc.strerror or exc}") from exc
        return path / ALIGNMENTS_FILE
    return path


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"
