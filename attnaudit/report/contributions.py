"""The report's section "Weights vs contributions", from the audit's tables alone.

The first example's maps side by side (attention weights, each contribution measure,
leave-one-out), the per-measure summary (the share of rows whose top key is not the
top-weight key, agreement with leave-one-out), the rank agreement table, the attention-sink
table, which measures could not be computed and why, and the judgement of the misconception
"a larger score always means a larger final contribution"
(:func:`attnaudit.checklist.contributions.larger_score_judgement`). An audit without these
tables (no intervention suite, or an older report) has no section.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from attnaudit.attribution.loo import QUICK_LOO_EDITS
from attnaudit.checklist.contributions import larger_score_judgement
from attnaudit.record import Family
from attnaudit.report import figures as figs
from attnaudit.report.tables import view

# drawn, in this order
PANELS = ("attention", "value_norm", "alti", "rollout", "value_zeroing", "loo")
TABLES = {
    "weights_vs_contributions": (
        "Weights vs contributions, per measure",
        "Per measure: the share of counted rows whose top key is not the top-weight key, the "
        "share whose top key is the top leave-one-out key (rows where leave-one-out is not "
        "constant), and the mean Kendall tau and top-k overlap with leave-one-out."),
    "contribution_agreement_summary": (
        "Rank agreement of the contribution measures",
        "Each contribution measure against leave-one-out and against the attention weights, "
        "over the eligible keys of every counted row (docs/metrics.md, agreement)."),
    "alignment_aer": (
        "Word alignments from each measure: alignment error rate",
        "Each measure's map read as an alignment (every output token linked to the source "
        "token with the largest value; token units) against the gold alignments (the "
        "target's own, or the --gold file): "
        "AER = 1 - (|A∩S| + |A∩P|) / (|A| + |S|) (Och & Ney), precision |A∩P| / |A|, "
        "recall |A∩S| / |S|; emit: the row of the step that emits the token, input: the row "
        "where it is the decoder input (docs/alignments.md)."),
    "sinks": (
        "Attention sinks (first batch)",
        "Per site and head, the key with the most incoming mass; a sink when most query rows "
        "put more than 0.3 on it. value_norm_ratio: its value norm over the row's mean."),
    "contribution_measures": (
        "Contribution measures computed",
        "How each measure is read as one map per step, and why one could not be computed."),
    "contribution_agreement": (
        "Rank agreement per row",
        "Every contribution measure against leave-one-out and the weights, per (example, "
        "step) row; excluded: why a row has no defined correlation."),
    "top_keys": (
        "Top key of every measure per row",
        "The eligible key with the largest value under each measure (loo_decided: "
        "leave-one-out is not constant over the row)."),
    "alignment_counts": (
        "Alignment link counts per batch",
        "The counts the alignment error rates sum: predicted |A|, sure |S|, hit_sure "
        "|A∩S|, hit_possible |A∩P|."),
    "contribution_example": (
        "First example's maps",
        "Every measure's value per (step, source key) of the first example, as drawn above "
        "before the rows are divided by their sums."),
}


def contribution_figures(tables: Mapping[str, pd.DataFrame], family: Family | None = None
                         ) -> list[figs.Figure]:
    """The section's figures: the first example's maps side by side, each row divided by
    its sum over the eligible keys (none without ``contribution_example``); ``family``, the
    target's, names the rows and columns."""
    example = tables.get("contribution_example")
    if example is None or example.empty:
        return []
    steps = example.drop_duplicates("step").set_index("step")["target_token"].sort_index()
    keys = example.drop_duplicates("key").set_index("key")["source_token"].sort_index()
    panels = []
    for measure in PANELS:
        part = example[example["measure"] == measure]
        if part.empty:
            continue
        grid = part.pivot_table(index="step", columns="key", values="value").reindex(
            index=steps.index, columns=keys.index).to_numpy(dtype=float)
        grid = np.clip(grid, 0.0, None)
        total = grid.sum(1, keepdims=True)
        grid = np.divide(grid, total, out=np.full_like(grid, np.nan), where=total > 0)
        panels.append((grid, [str(k) for k in keys], "weights" if measure == "attention"
                       else measure))
    if len(panels) < 2:
        return []
    decoder_only = family == Family.DECODER_ONLY
    rows, columns = (("continuation token (step)", "prompt tokens") if decoder_only
                     else ("emitted token (step)", "source tokens"))
    return [figs.paired_heatmaps(
        "contribution_maps", panels, [str(t) for t in steps], value_label="share of the row",
        row_label=rows,
        title="Weights vs contributions: first audited example",
        caption=("Left to right: the attention weights (mean over cross-attention sites and "
                 "heads), the value-norm contributions (mean over decoder layers), ALTI+ and "
                 "rollout composed through the whole model, value zeroing (mean over decoder "
                 "layers; not in a quick audit) and input leave-one-out (a quick audit "
                 f"replaces windows of keys at once on prompts of more than {QUICK_LOO_EDITS} "
                 "eligible keys, or fewer on a large model: the metadata's "
                 "leave_one_out_window says); each "
                 "row is divided by its sum over the eligible source keys so that the "
                 f"panels share one scale. Rows are {rows.split(' (')[0]}s, columns "
                 f"{columns}."))]


def contributions_section(tables: Mapping[str, pd.DataFrame], family: Family | None = None
                          ) -> dict[str, Any] | None:
    """The section's context for the template, or None when the audit has no such tables."""
    if "weights_vs_contributions" not in tables:
        return None
    judged = larger_score_judgement(tables)
    measures = tables.get("contribution_measures", pd.DataFrame())
    missing = measures[measures["status"] != "computed"] if len(measures) else measures
    return {
        "figures": contribution_figures(tables, family),
        "tables": [view(name, title, caption, tables[name])
                   for name, (title, caption) in TABLES.items() if name in tables],
        "status": None if judged is None else judged[0],
        "judgement": None if judged is None else judged[1],
        "not_computed": [(r.measure, not_computed_text(r.status, r.reason))
                         for r in missing.itertuples(index=False)],
    }


def not_computed_text(status: str, reason: str) -> str:
    """Why a measure was not computed, in words: its status ("not applicable": the model
    has no such quantity; "not run": this audit left it out), then the reason."""
    if reason.startswith(status):
        return reason
    said = {"not applicable": "does not apply to this model"}.get(status, status)
    return f"{said}: {reason}" if reason else said
