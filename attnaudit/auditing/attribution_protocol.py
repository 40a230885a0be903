"""The attribution protocol of the intervention suite: the attribution methods, leave-one-out,
their rank agreement with the weights, and the weights-vs-contributions tables.

It registers here, not in :mod:`attnaudit.interventions.protocols`: it needs
:mod:`attnaudit.attribution` and :mod:`attnaudit.auditing.contribution_suite`, layers above
the registry. It runs on the whole batch (degenerate rows included: the agreement table
marks them undefined) and leaves the batch's importance maps in ``ctx.shared["importances"]``
(name -> (B, T, n), ``attention``, the gradient methods and ``loo``), and the contribution
measures' in ``ctx.shared["contributions"]`` (maps and reasons), for protocols that name it
in ``after`` (a faithfulness test that ranks keys by an attribution).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import pandas as pd

from attnaudit.analysis.bootstrap import bootstrap_interval
from attnaudit.analysis.words import word_importance_table
from attnaudit.attribution.agreement import agreement, summarise_agreement
from attnaudit.attribution.loo import (
    QUICK_LOO_EDITS,
    QUICK_LOO_MIN_EDITS,
    QUICK_LOO_MULTIPLY_ADDS,
    audit_edits,
    audit_window,
    edit_count,
    edit_sequences,
    example_windows,
    leave_one_out,
)
from attnaudit.attribution.methods import attribute
from attnaudit.attribution.options import (
    DETACHED_BY_DEFAULT,
    GRADIENT_METHODS,
    INTEGRATION_POINTS,
    LEAST_INTEGRATION_POINTS,
)
from attnaudit.auditing.contribution_suite import (
    NOT_IN_QUICK,
    add_contribution_parts,
    contribution_tables,
    contribution_terms,
)
from attnaudit.interventions.protocol import (
    BATCH,
    BatchContext,
    ChecklistLine,
    Columns,
    Cost,
    InterventionProtocol,
    SuiteSettings,
    SummaryRow,
    table_with,
)
from attnaudit.interventions.registry import register_protocol
from attnaudit.interventions.work_budget import WORK_BUDGET

ATTRIBUTION = "attribution"
IMPORTANCES = "importances"  # the ctx.shared key of the batch's importance maps
# and of the contribution measures' maps and reasons (contribution_importances)
CONTRIBUTIONS = "contributions"


def integration_point_count(ctx: BatchContext) -> int:
    """Integrated gradients' points on ``ctx``'s batch: :data:`INTEGRATION_POINTS`, or as many
    as the work budget buys (a point: one forward pass over each sequence and a backward
    pass per emitted step), at least :data:`LEAST_INTEGRATION_POINTS`."""
    steps = int(ctx.ref.emitted.shape[1])
    return ctx.affordable(INTEGRATION_POINTS, ctx.sequence_multiply_adds() * (1 + steps),
                          LEAST_INTEGRATION_POINTS)


def zeroing_reruns(ctx: BatchContext) -> int:
    """Value zeroing's re-runs per example of ``ctx``'s batch, each a whole pass: one per key
    (source or prompt, and emitted steps) and edited site."""
    keys = int(ctx.batch.source_ids.shape[1]) + int(ctx.ref.emitted.shape[1])
    return len(ctx.ref.sites) * keys


def zeroing_left_out(ctx: BatchContext) -> str | None:
    """Why value zeroing does not run on ``ctx``'s batch (the contribution measures' reason),
    or None where it runs: a quick audit leaves it out, a full one where its re-runs cost
    more than the work budget per example."""
    if ctx.settings.quick:
        return NOT_IN_QUICK
    reruns, budget = zeroing_reruns(ctx), ctx.settings.work_budget
    needed = reruns * ctx.sequence_multiply_adds()
    if needed <= budget:
        return None
    return (f"not run: its {reruns} re-runs per example (one whole pass per key and decoder "
            f"layer) cost {needed:.1e} multiply-adds, more than the work budget of "
            f"{budget:.0e} (work_budget)")


def loo_window(ctx: BatchContext) -> Any:
    """The suite's leave-one-out window on ``ctx``'s batch
    (:func:`~attnaudit.attribution.loo.audit_window` under the settings' work budget)."""
    return audit_window(ctx.settings.quick, ctx.sequence_multiply_adds(),
                        ctx.settings.work_budget)


def tau_intervals(summary: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """``summary`` (one row per pair) with ``kendall_tau_mean_low``/``_high``: the bootstrap
    interval over examples of the pair's mean Kendall tau over its defined ``rows``."""
    low, high = [], []
    for pair in summary.itertuples(index=False):
        part = rows[(rows["method_a"] == pair.method_a) & (rows["method_b"] == pair.method_b)
                    & (rows["excluded"] == "")]
        found = bootstrap_interval(part["kendall_tau"].to_numpy(dtype=float),
                                   part["example"].to_numpy())
        low.append(found.low)
        high.append(found.high)
    return summary.assign(kendall_tau_mean_low=low, kendall_tau_mean_high=high)


@register_protocol
class Attribution(InterventionProtocol):
    """Attribution methods, leave-one-out and agreement (:mod:`attnaudit.attribution`),
    and the contribution measures beside them (:mod:`~attnaudit.auditing.contribution_suite`)."""

    name = ATTRIBUTION
    columns: ClassVar[Columns] = {
        "agreement": ("method_a", "method_b", "example", "step", "kendall_tau"),
        "top_keys": ("example", "step"),
        "contribution_measures": ("measure", "reading", "status", "reason")}
    scope = BATCH
    row_tables = ()

    def progress_items(self, counted_rows: int) -> int:
        return 2  # the attribution methods, then leave-one-out

    def cost(self, ctx: BatchContext) -> Cost:
        """An estimate: one forward and backward pass per method over the batch, and one
        edited sequence per leave-one-out edit (an eligible key, or in a quick audit a
        window of them; leave-one-out folds a batch's worth per pass). In whole sequences:
        the embedded pass, one forward per gradient group and per integration point, each
        with a backward pass per step; leave-one-out's edited sequences, each a share of one
        where it runs from the cached prefix
        (:func:`~attnaudit.attribution.loo.edit_sequences`); and the
        contribution trace's pass; and the terms of ALTI's arithmetic
        (:func:`~attnaudit.auditing.contribution_suite.contribution_terms`)."""
        methods, examples, ref = ctx.settings.methods, len(ctx.batch), ctx.ref
        window = loo_window(ctx)
        keys = ctx.target.explain_keys(ctx.batch)
        edits = edit_count(keys, window)
        loo = -(-edits // max(examples, 1))
        detached = (DETACHED_BY_DEFAULT if ctx.settings.attribution is None
                    else ctx.settings.attribution.detach_attention)
        integrated = "integrated_gradients" in methods
        points = integration_point_count(ctx) if integrated else 0
        gradients = len({m in detached for m in methods if m in GRADIENT_METHODS}) + points
        notes = []
        if integrated and points < INTEGRATION_POINTS:
            notes.append(f"integrated gradients: {points} of {INTEGRATION_POINTS} points")
        if not ctx.settings.quick and edits < int(keys.sum()):
            notes.append(f"leave-one-out: {edits} edits for {int(keys.sum())} keys")
        reruns, left_out = zeroing_reruns(ctx), zeroing_left_out(ctx)
        zeroing = 0 if left_out else reruns
        if not ctx.settings.quick and left_out:
            notes.append(f"value zeroing: not run ({reruns} re-runs per example)")
        steps = int(ref.emitted.shape[1])
        edited = edit_sequences(ctx.target, ctx.batch, ref.states, window,
                                vocab=int(ref.probs.shape[-1]), steps=steps,
                                max_memory=ref.budget.max_memory)
        return Cost(examples * len(methods) + edits, len(methods) + loo, len(methods),
                    exact=False, sequences=examples * (2 + gradients + zeroing) + edited,
                    backward_sequences=examples * steps * gradients,
                    terms=contribution_terms(ctx.target, ctx.batch, steps),
                    notes=tuple(notes))

    def run(self, ctx: BatchContext) -> dict[str, pd.DataFrame]:
        target, batch, ref, options = ctx.target, ctx.batch, ctx.ref, ctx.settings.attribution
        methods, progress = ctx.settings.methods, ctx.settings.progress
        found = attribute(target, batch, ref.emitted, methods, progress=progress,
                          n_steps=integration_point_count(ctx), output=options.output,
                          reduction=options.reduction,
                          baseline=options.baseline, target_side=options.target_side,
                          detach_attention=options.detach_attention,
                          contrast=options.contrast_ids(batch, ref.emitted, target.eos_id),
                          max_memory=ref.budget.max_memory, seed=ref.seed,
                          first_example=ref.first_example)
        per_sequence = ctx.sequence_multiply_adds()
        window = loo_window(ctx)
        loo = leave_one_out(target, batch, ref.emitted, reference_probs=ref.probs,
                            max_memory=ref.budget.max_memory, progress=progress,
                            states=ref.states, window=window)
        importances = {"attention": ref.attention, **found.importance, "loo": loo}
        if ctx.shared is not None:
            ctx.shared[IMPORTANCES] = importances
        parts: dict[str, list[pd.DataFrame]] = {}
        if ref.first_example == 0:  # the first example, per source word (a bounded table)
            parts["word_importance"] = [word_importance_table(target, batch, ref.emitted,
                                                              importances, ref.steps)]
        rows_agree = agreement(importances, target.explain_keys(batch), ref.steps)
        rows_agree["example"] += ref.first_example
        parts["agreement"] = [rows_agree]  # before the contribution agreement
        skipped = zeroing_left_out(ctx)
        contributions = add_contribution_parts(target, batch, ref, importances, parts,
                                               zeroing=skipped is None,
                                               skipped=skipped or NOT_IN_QUICK,
                                               gold=ctx.settings.gold)
        if ctx.shared is not None:
            ctx.shared[CONTRIBUTIONS] = contributions
        if found.convergence_delta is not None:
            delta = found.delta_frame()
            delta["example"] += ref.first_example
            parts["attribution_delta"] = [delta]
        if found.prefix_scores is not None:
            prefix = found.to_frame().query("side == 'prefix'").drop(columns="side")
            prefix["example"] += ref.first_example
            parts["attribution_prefix"] = [prefix]
        if ctx.facts is not None:
            ctx.facts["variants"] = {m: found.variant(m) for m in methods}
            windows = example_windows(target.explain_keys(batch), window).tolist()
            ctx.facts.setdefault("loo_windows", set()).update(windows)
            edits = audit_edits(ctx.settings.quick, per_sequence, ctx.settings.work_budget)
            if edits is not None:
                ctx.facts.setdefault("loo_edits", set()).add(edits)
        return {name: pd.concat(frames, ignore_index=True) for name, frames in parts.items()}

    def assemble(self, parts: Mapping[str, pd.DataFrame], tables: Mapping[str, pd.DataFrame]
                 ) -> dict[str, pd.DataFrame]:
        out = dict(parts)
        out["agreement_summary"] = tau_intervals(summarise_agreement(out["agreement"]),
                                                 out["agreement"])
        out.update(contribution_tables({**tables, **out}))
        return out

    def summary(self, tables: Mapping[str, pd.DataFrame]) -> list[SummaryRow]:
        if "attribution_delta" not in tables:
            return []
        delta = tables["attribution_delta"]["convergence_delta"].abs()
        return [("convergence_delta_abs", delta.mean(), len(delta),
                 "integrated gradients, mean |delta| in probability units")]

    def checklist_lines(self, tables: Mapping[str, pd.DataFrame]) -> list[ChecklistLine]:
        summary = table_with(tables, "agreement_summary", "kendall_tau_mean")
        if summary is None:
            return []
        parts = [f"{r.method_a} vs {r.method_b}: {r.kendall_tau_mean:.3g} (sig_frac "
                 f"{r.sig_frac:.2f}, {r.n} rows)" for r in summary.itertuples(index=False)]
        return [("Mean Kendall tau-b between importance rankings — " + "; ".join(parts)
                 + ". Jain & Wallace report 0.24-0.44 between attention and gradients for "
                 "BiLSTM classifiers with additive attention (a different task).",
                 "causal_explanation")]

    def metadata(self, settings: SuiteSettings, examples: set[int] | None,
                 facts: Mapping[str, Any]) -> dict[str, object]:
        return {"attribution_methods": list(settings.methods),
                "attribution_variants": facts.get("variants", {}),
                "attribution_output": settings.attribution.output,
                "leave_one_out_window": loo_window_text(
                    settings.quick, max(facts["loo_windows"]) if facts.get("loo_windows")
                    else None, min(facts["loo_edits"]) if facts.get("loo_edits") else None,
                    settings.work_budget)}


def loo_window_text(quick: bool, largest: int | None, edits: int | None = None,
                    work_budget: float = WORK_BUDGET) -> str:
    """The metadata's account of the leave-one-out that ran; largest: the largest window
    it used, edits: the fewest edits per example it allowed (None: it did not run)."""
    if not quick and (largest is None or largest == 1):
        return "1 (every key alone)"
    rule = (f"at most E edits per example: E = {QUICK_LOO_EDITS}, or on a model where "
            f"{QUICK_LOO_EDITS} edited sequences cost more than {QUICK_LOO_MULTIPLY_ADDS:.0e} "
            f"multiply-adds (parameters x tokens per sequence) as many as they buy" if quick
            else f"E edits per example: as many edited sequences as the work budget "
            f"({work_budget:.0e} multiply-adds per example, parameters x tokens per "
            f"sequence) buys")
    text = (f"ceil(n_eligible / E) consecutive eligible keys replaced at once, {rule}, at "
            f"least {QUICK_LOO_MIN_EDITS}; every key alone up to E eligible keys")
    if edits is not None:
        text += f"; here E = {edits}"
    return text if largest is None else f"{text}; largest window: {largest}"
