"""The figures of each checklist item, drawn from an audit's tables (and its example maps).

Every figure but the example heatmaps is drawn from a tidy table alone, so a saved report
loaded back (:meth:`attnaudit.Audit.load`) draws them too.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from attnaudit.analysis.example_maps import START_LABEL, ExampleMaps
from attnaudit.attribution.agreement import ATTENTION, GRADIENT, JAIN_WALLACE_REFERENCE
from attnaudit.interventions.permutation import BIN_LABELS, SMALL_TVD, max_attention_bins
from attnaudit.interventions.protocol import ROWS, table_with
from attnaudit.report import figures as figs
from attnaudit.report.explorer import AXES, PLAIN_AXES


def item_figures(tables: Mapping[str, pd.DataFrame], example: ExampleMaps | None,
                 max_masked_mass: float | None) -> dict[str, list[figs.Figure]]:
    """Figures per checklist item key.

    Args:
        tables: the audit's tables by CSV name (``distribution_metrics``, ``site_summary``
            and the intervention tables are read; missing ones draw nothing).
        example: the first example's attention maps, or None (no heatmaps).
        max_masked_mass: the masked-mass tolerance, dashed on the masked-mass bars.
    """
    out: dict[str, list[figs.Figure]] = {}
    if example is not None or "distribution_metrics" in tables:
        out["distributions"] = [*_example_heatmaps(example), *_entropy_figure(tables)]
    if "site_summary" in tables:
        out["eligibility"] = _masked_mass_figure(tables["site_summary"], max_masked_mass)
    out["interventions"] = _intervention_figures(tables)
    return out


def _example_heatmaps(example: ExampleMaps | None) -> list[figs.Figure]:
    if example is None:
        return []
    out = []
    for index, (site, amap) in enumerate(example.maps.items()):
        if 0 in amap.weights.shape:  # an empty output, or no real source token: no map
            continue
        heads = amap.weights.shape[0]
        weights = amap.weights.mean(0) if heads > 1 else amap.weights[0]
        what = f"the mean over {heads} heads" if heads > 1 else "its single head"
        rows, columns = AXES.get((example.family, amap.role), PLAIN_AXES)
        out.append(figs.attention_heatmap(
            f"example_map_{index}", weights, amap.key_labels, amap.query_labels,
            axes=(rows, columns), title=f"{site}: first audited example",
            caption=(f"Attention weights at {site} ({amap.role}), {what}, for the source "
                     f"\"{example.source}\". Rows are {rows}, columns {columns}; only "
                     "real tokens and steps up to the end of the output are drawn. A heatmap "
                     "shows where this retrieval read, not why the output was produced.")))
    return out


def _entropy_figure(tables: Mapping[str, pd.DataFrame]) -> list[figs.Figure]:
    table = tables.get("distribution_metrics")
    if table is None:
        return []
    entropy = figs.finite_or_empty(table[table["metric"] == "entropy_norm"], "mean")
    if entropy.empty:
        return []
    return [figs.site_head_heatmap(
        "entropy_by_head", entropy, "mean", vmin=0.0, vmax=1.0,
        title="Normalised entropy by site and head",
        caption="Mean entropy_norm = H / ln(n_valid) over counted rows: 0 is all weight on "
                "one key, 1 is uniform over the eligible keys.")]


def _masked_mass_figure(site_summary: pd.DataFrame,
                        max_masked_mass: float | None) -> list[figs.Figure]:
    frame = figs.finite_or_empty(site_summary[["site", "masked_mass_max"]], "masked_mass_max")
    if frame.empty:
        return []
    line = "" if max_masked_mass is None else f"; dashed: the tolerance {max_masked_mass:g}"
    return [figs.site_bars(
        "masked_mass", frame, "masked_mass_max", tolerance=max_masked_mass,
        title="Largest masked mass per site",
        caption=f"The largest weight sum on ineligible keys in any counted row{line}. No bar "
                "means no mass on ineligible keys.")]


def _intervention_figures(tables: Mapping[str, pd.DataFrame]) -> list[figs.Figure]:
    out = []
    per_row = table_with(tables, ROWS, "perm_median_tvd")
    if per_row is not None:
        binned = figs.finite_or_empty(
            per_row.assign(max_attention_bin=max_attention_bins(per_row["max_attention"])),
            "perm_median_tvd")
        if not binned.empty:
            out.append(figs.binned_violins(
                "permutation_tvd", binned, "max_attention_bin", "perm_median_tvd",
                order=list(BIN_LABELS), threshold=SMALL_TVD,
                title="Permutation: median TVD by max attention",
                caption="Per row, the median TVD of the output distribution over the "
                        "permutations, in 4 equal-width bins of the row's largest weight, "
                        "each labelled by its left edge as in the permutation_bins table "
                        f"(Jain & Wallace's plot); dashed: {SMALL_TVD:g}."))
    out += _attribution_sides(tables)
    agreement = agreement_with_intervals(tables)
    if agreement is not None:
        low, high, _ = band = jain_wallace_band()
        out.append(figs.interval_bars(
            "agreement", agreement, "pair", "kendall_tau_mean", "ci_low", "ci_high",
            band=band,
            title="Agreement between importance rankings: Kendall tau-b",
            caption="Mean Kendall tau-b over the (example, step) rows with eligible keys, for "
                    "each pair of attention, attributions and leave-one-out; error bars: "
                    f"{CI_LEVEL:.0%} bootstrap interval of that mean, resampling examples "
                    f"({N_BOOTSTRAP} draws, seed {BOOTSTRAP_SEED}). Shaded: the band of "
                    f"mean tau between attention and gradients that Jain & Wallace (2019) "
                    f"report for BiLSTM classifiers with additive attention, {low:g} to "
                    f"{high:g} over their five datasets (a different task; "
                    "docs/metrics.md)."))
    return out


def _attribution_sides(tables: Mapping[str, pd.DataFrame]) -> list[figs.Figure]:
    """The first example's attributions to its source words beside those to its output
    prefix, for one method (input x gradient where run): drawn only when target-side
    attribution ran (the ``attribution_prefix`` table)."""
    prefix, words = tables.get("attribution_prefix"), tables.get("word_importance")
    if prefix is None or words is None:
        return []
    prefix = prefix[prefix["example"] == 0]
    methods = list(dict.fromkeys(prefix["method"]))
    if not methods:
        return []
    method = GRADIENT if GRADIENT in methods else methods[0]
    source = words[words["method"] == method]
    if source.empty:
        return []
    step_labels = source.drop_duplicates("step").set_index("step")["target_token"].sort_index()
    word_labels = source.drop_duplicates("word").set_index("word")["word_text"].sort_index()
    steps = step_labels.index
    by_word = source.pivot_table(index="step", columns="word", values="value").reindex(
        index=steps, columns=word_labels.index)
    scored = prefix[prefix["method"] == method]
    # decoder inputs: the start token (where the target scores it), then the output
    keys = range(int(scored["key"].min()), int(steps.max()) + 1)
    by_key = scored.pivot_table(
        index="step", columns="key", values="importance").reindex(index=steps, columns=keys)
    tokens = dict(step_labels.items())
    prefix_labels = [START_LABEL if key == 0 else str(tokens.get(key - 1, key - 1))
                     for key in keys]
    return [figs.paired_heatmaps(
        "attribution_sides", [(by_word.to_numpy(), [str(w) for w in word_labels], "source word"),
                              (by_key.to_numpy(), prefix_labels, "output prefix token")],
        [str(t) for t in step_labels], value_label=f"{method} importance",
        title=f"{method}: source words and output prefix, first audited example",
        caption=(f"{method} importance of each source word (left: the sum of its tokens' "
                 "importance, normalised over the source at each step) and of each decoder "
                 "input token (right: the start token where the target scores it, then the "
                 "tokens emitted before the step, normalised over the prefix) for every "
                 "emitted token of the first example; blank: positions after the step, which "
                 "it cannot read."))]


CI_LEVEL = 0.95
N_BOOTSTRAP = 1000
BOOTSTRAP_SEED = 0


def jain_wallace_band() -> tuple[float, float, str]:
    """(lowest, highest, label) of Jain & Wallace's mean tau between attention and gradient
    importance over their datasets (:data:`JAIN_WALLACE_REFERENCE`)."""
    ref = JAIN_WALLACE_REFERENCE
    pair = ref[(ref["method_a"] == ATTENTION) & (ref["method_b"] == GRADIENT)]
    return (float(pair["kendall_tau_low"].min()), float(pair["kendall_tau_high"].max()),
            "Jain & Wallace (2019), attention vs gradient")


def agreement_with_intervals(tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame | None:
    """Per pair (``pair`` label): ``kendall_tau_mean`` over the rows with a defined tau and
    its bootstrap interval ``ci_low`` .. ``ci_high`` (:data:`CI_LEVEL`), resampling whole
    examples, since the steps of one example are not independent; None without the
    per-row agreement table."""
    rows = table_with(tables, "agreement", "kendall_tau")
    if rows is None:
        return None
    rows = figs.finite_or_empty(rows, "kendall_tau")
    gen = np.random.default_rng(BOOTSTRAP_SEED)
    out = []
    for (a, b), group in rows.groupby(["method_a", "method_b"], sort=False):
        per_example = group.groupby("example")["kendall_tau"].agg(["sum", "count"])
        sums, counts = per_example["sum"].to_numpy(), per_example["count"].to_numpy()
        draw = gen.integers(0, len(sums), size=(N_BOOTSTRAP, len(sums)))
        means = sums[draw].sum(1) / counts[draw].sum(1)
        tail = (1 - CI_LEVEL) / 2
        out.append({"pair": f"{a} vs {b}", "kendall_tau_mean": sums.sum() / counts.sum(),
                    "ci_low": float(np.quantile(means, tail)),
                    "ci_high": float(np.quantile(means, 1 - tail))})
    return pd.DataFrame(out) if out else None
