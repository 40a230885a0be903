"""The AER table of the bundled date models: word alignments (here: character alignments)
read from every measure, per layer and combined, under both step conventions, against the
gold rule of ``attnaudit_examples.date.gold`` on the 400 audit sources.

    python -m benchmarks.date_alignment [--limit 400] [--measures weights,saliency,...]

Prints one markdown table per model (the README's and docs/alignments.md's), and the AER
of the oracle: the best aligner that links every output character to one source
character (the hyphens have no gold link, so no such aligner reaches 0). A measure that
cannot be computed for a model (the LSTM's additive attention exposes no values) is a row
saying why.
"""

from __future__ import annotations

import argparse

import pandas as pd

from attnaudit.alignments.aer import count_links
from attnaudit.alignments.maps import MEASURES
from attnaudit.alignments.run import aer_table
from attnaudit.alignments.units import output_lengths
from attnaudit.errors import AttnauditError

DEFAULT_MEASURES = ("weights", "value_norm", "alti", "rollout", "value_zeroing", "saliency",
                    "input_x_gradient", "integrated_gradients", "loo")


def _markdown(table: pd.DataFrame, missing: dict[str, str]) -> str:
    wide = table.pivot_table(index=["measure", "layer"], columns="convention",
                             values=["aer", "precision", "recall"], sort=False)
    lines = ["| measure | layer | AER (emit) | P / R (emit) | AER (input) |",
             "|---|---|---|---|---|"]
    for (measure, layer), row in wide.iterrows():
        lines.append(f"| {measure} | {layer} | {row[('aer', 'emit')]:.3f} | "
                     f"{row[('precision', 'emit')]:.3f} / {row[('recall', 'emit')]:.3f} | "
                     f"{row[('aer', 'input')]:.3f} |")
    lines += [f"| {measure} | - | n/a | {reason} | n/a |" for measure, reason in missing.items()]
    return "\n".join(lines)


def main() -> None:
    from attnaudit_examples.date import gold as date_gold
    from attnaudit_examples.date.target import make_target as lstm
    from attnaudit_examples.date_transformer.target import make_target as bart

    options = argparse.ArgumentParser(description=__doc__)
    options.add_argument("--limit", type=int, default=400)
    options.add_argument("--measures", default=",".join(DEFAULT_MEASURES))
    args = options.parse_args()
    measures = [m for m in args.measures.split(",") if m in MEASURES]
    gold = date_gold.audit_gold(args.limit)
    for name, make in (("date BART", bart), ("date LSTM", lstm)):
        target = make()
        tables, missing = [], {}
        for measure in measures:
            try:
                tables.append(aer_table(target, gold, [measure], units="tokens",
                                        limit=args.limit))
            except AttnauditError as exc:
                missing[measure] = " ".join(str(exc).split())[:160]
        lengths = [n for batch in target.iter_batches(args.limit)
                   for n in output_lengths(target, target.greedy(batch))]
        oracle = count_links([date_gold.oracle(g, n) for g, n in zip(gold, lengths,
                                                                         strict=True)], gold)
        print(f"\n{name} ({args.limit} sources; oracle AER {oracle.aer:.3f})\n")
        print(_markdown(pd.concat(tables, ignore_index=True), missing))


if __name__ == "__main__":
    main()
