"""Weights vs contributions: the tables of that report section and the judgement they give
on the misconception "a larger score always means a larger final contribution".

The numbers come from ``weights_vs_contributions`` (one row per measure: the share of
counted rows whose top key is not the top-weight key, the share whose top key is the top
leave-one-out key, the mean Kendall tau with leave-one-out); this module only words them.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

# The suite's tables that belong to the "weights vs contributions" section, not to the
# intervention item's evidence.
CONTRIBUTION_TABLES = ("weights_vs_contributions", "contribution_measures",
                       "contribution_agreement_summary", "sinks", "contribution_agreement",
                       "top_keys", "contribution_example", "alignment_aer", "alignment_counts")
PREFERRED = ("alti", "value_norm", "rollout")  # the contribution measure the verdict quotes
MATERIAL_SHARE = 0.05  # top keys that differ in fewer rows than this count as agreeing


def _row(table: pd.DataFrame, measure: str) -> pd.Series | None:
    found = table[table["measure"] == measure]
    return None if found.empty else found.iloc[0]


def larger_score_judgement(tables: Mapping[str, pd.DataFrame]) -> tuple[str, str] | None:
    """(``refuted`` or ``not refuted here``, the sentence with its numbers), or None when
    no contribution measure was computed."""
    table = tables.get("weights_vs_contributions")
    if table is None or table.empty:
        return None
    weights = _row(table, "weights")
    found = {m: row for m in PREFERRED if (row := _row(table, m)) is not None}
    name = next(iter(found), None)  # the first of PREFERRED computed
    if weights is None or name is None:
        return None
    best = found[name]
    differs = float(best["top_differs_from_weights"])
    others = [f"{m} {float(row['top_differs_from_weights']):.0%}"
              for m, row in found.items() if m != name]
    text = (f"The key with the largest attention weight is not the key with the largest "
            f"{name} contribution in {differs:.0%} of {int(best['rows'])} rows"
            f"{' (' + ', '.join(others) + ')' if others else ''}. The top-weight key is the "
            f"top leave-one-out key in {float(weights['top_is_loo_top']):.0%} of rows, the top "
            f"{name} key in {float(best['top_is_loo_top']):.0%}; mean Kendall tau with "
            f"leave-one-out: weights {float(weights['kendall_tau_vs_loo']):.3g}, {name} "
            f"{float(best['kendall_tau_vs_loo']):.3g}.")
    status = "refuted" if differs >= MATERIAL_SHARE else "not refuted here"
    return status, text


def contribution_lines(tables: Mapping[str, pd.DataFrame]) -> list[tuple[str, str]]:
    """(sentence, misconception key) for the checklist's misconception notes."""
    judged = larger_score_judgement(tables)
    return [] if judged is None else [(judged[1], "larger_score")]
