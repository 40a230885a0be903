"""The faithfulness protocol of the intervention suite: how far the output follows each
importance measure's ranking of the source keys (docs/metrics.md, "Faithfulness of the
importance measures"; the removal code is :mod:`attnaudit.interventions.faithfulness`).

It runs after the attribution protocol and ranks keys by every measure the audit computes at
a step: the attention weights (the mean over the edited sites and heads, ``weights``, and each
site's head mean, ``weights:layer<i>`` in site order), rollout, ALTI+ and value norms (and,
in full mode, value zeroing), as
:func:`~attnaudit.auditing.contribution_suite.contribution_importances` reads them,
the gradient methods the suite ran, leave-one-out, and a seeded random ranking, the floor.
Quick mode runs on :data:`QUICK_EXAMPLES` seeded examples, the measures quick computes (no
integrated gradients, no value zeroing, no per-layer weights) and a budget of edited sources
(:func:`budget_per_example`): each example's rows in a seeded order, as many as the budget
holds (:func:`~attnaudit.interventions.faithfulness.rows_within`); full mode on every row of
every example, every measure, unless a row's edited sources cost more than the work budget
(:mod:`attnaudit.interventions.work_budget`) buys per example: then on the rows it buys,
chosen as the quick budget chooses them.

Tables: ``faithfulness_rows`` (per example, step and measure: the removal curves, AOPC and
normalised AOPC) and ``faithfulness_summary`` (per measure: the row means with 95 %
bootstrap intervals over examples). A measure that cannot be computed for the target is
listed in the metadata's ``faithfulness_not_computed`` with the reason, and has no rows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import torch

from attnaudit.analysis.bootstrap import bootstrap_interval
from attnaudit.attribution.loo import leave_one_out, replacement_id
from attnaudit.attribution.methods import attribute
from attnaudit.attribution.options import QUICK_OMITTED
from attnaudit.auditing.attribution_protocol import (
    ATTRIBUTION,
    CONTRIBUTIONS,
    IMPORTANCES,
    integration_point_count,
    loo_window,
    zeroing_left_out,
)
from attnaudit.auditing.contribution_suite import (
    CONTRIBUTION_MEASURES,
    ZEROING,
    contribution_importances,
)
from attnaudit.interventions.faithfulness import (
    FRACTIONS,
    aopc,
    bin_sizes,
    normalised,
    random_ranking,
    ranking,
    removal_curves,
    reversed_ranking,
    row_seed,
    rows_within,
)
from attnaudit.interventions.memory import whole_passes
from attnaudit.interventions.protocol import (
    SUBSET,
    BatchContext,
    ChecklistLine,
    Columns,
    Cost,
    InterventionProtocol,
    SuiteSettings,
    seeded_examples,
    table_with,
)
from attnaudit.interventions.registry import register_protocol

FAITHFULNESS = "faithfulness"
QUICK_EXAMPLES = 8  # seeded examples a quick suite measures
# A quick suite's edited sources: this many per audited example (the model's own work is
# about two sequences per example: greedy decoding and one teacher-forced pass) ...
QUICK_SEQUENCES_PER_EXAMPLE = 8
# ... or as many as this many multiply-adds buy (parameters x tokens per sequence), if more
QUICK_MULTIPLY_ADDS = 2e12
ORDER_SALT = 0x5EED  # the seed of an example's row order: its first row's seed + this
RANDOM = "random"
# suite importance name -> measure name in the tables
NAMES = {"attention": "weights", "loo": "leave_one_out", "alti": "alti_plus"}
CURVE_COLUMNS = tuple([f"comprehensiveness_{f}" for f in FRACTIONS]
                      + [f"sufficiency_{f}" for f in FRACTIONS])
SCORES = ("aopc_comprehensiveness", "aopc_sufficiency", "normalised_aopc_comprehensiveness",
          "normalised_aopc_sufficiency")
# per row, the lowest and highest AOPC over the orderings evaluated (normalisation's bounds)
BOUNDS = tuple(f"aopc_{kind}_bound_{end}" for kind in ("comprehensiveness", "sufficiency")
               for end in ("low", "high"))
ROW_COLUMNS = ("example", "step", "measure", "n_eligible", "p_full", *CURVE_COLUMNS, *SCORES,
               *BOUNDS, "baseline")
SUMMARY_COLUMNS = ("measure", "examples", "rows",
                   *(f"{s}{end}" for s in SCORES for end in ("", "_low", "_high")), "baseline")


def _suite_importances(ctx: BatchContext) -> dict[str, torch.Tensor]:
    """The attribution protocol's maps of the batch, or, run alone, the same measures
    computed here (the suite's methods and leave-one-out)."""
    shared = ctx.shared if ctx.shared is not None else {}
    if IMPORTANCES in shared:
        return dict(shared[IMPORTANCES])
    target, batch, ref, options = ctx.target, ctx.batch, ctx.ref, ctx.settings.attribution
    found = attribute(target, batch, ref.emitted, ctx.settings.methods,
                      n_steps=integration_point_count(ctx), output=options.output,
                      reduction=options.reduction,
                      baseline=options.baseline, max_memory=ref.budget.max_memory,
                      seed=ref.seed, first_example=ref.first_example)
    loo = leave_one_out(target, batch, ref.emitted, reference_probs=ref.probs,
                        max_memory=ref.budget.max_memory, states=ref.states,
                        window=loo_window(ctx))
    return {"attention": ref.attention, **found.importance, "loo": loo}


def measure_maps(ctx: BatchContext) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Measure -> (B, T, n) importance map, and measure -> why it was not computed."""
    ref = ctx.ref
    suite = _suite_importances(ctx)
    maps = {"weights": suite.pop("attention").float().cpu()}
    for i, site in enumerate(() if ctx.settings.quick else ref.sites):
        maps[f"weights:layer{i}"] = ref.weights[site].float().mean(1)
    wanted = CONTRIBUTION_MEASURES + (() if zeroing_left_out(ctx) else (ZEROING,))
    shared = ctx.shared if ctx.shared is not None else {}
    found, reasons = (shared[CONTRIBUTIONS] if CONTRIBUTIONS in shared else
                      contribution_importances(ctx.target, ctx.batch, ref.emitted, wanted))
    missing = {NAMES.get(m, m): why for m, why in reasons.items()}
    for name, values in {**found, **suite}.items():
        maps[NAMES.get(name, name)] = values.detach().float().cpu()
    return maps, missing


@register_protocol
class Faithfulness(InterventionProtocol):
    """Comprehensiveness, sufficiency, AOPC and normalised AOPC of every importance measure
    and of a seeded random ranking (module docstring)."""

    name = FAITHFULNESS
    columns: ClassVar[Columns] = {"faithfulness_rows": ROW_COLUMNS}
    scope = SUBSET
    after = (ATTRIBUTION,)
    row_tables = ("faithfulness_rows",)

    def examples(self, settings: SuiteSettings) -> set[int] | None:
        if not settings.quick:
            return None
        return seeded_examples(settings.n_examples, min(QUICK_EXAMPLES, settings.n_examples),
                               settings.seed)

    def cost(self, ctx: BatchContext) -> Cost:
        """A bound: each ordering's removal and keep-only source at every distinct bin size k
        (no more than the k-subsets of the row's keys), for every row (identical edited
        sources of one example run once, so fewer run); under the quick budget or the work
        budget, per example, the rows whose bounds fit in it, taken in turn until one does
        not; in chunks the memory budget holds, each a whole teacher-forced sequence; the
        measures' traced pass besides."""
        # per-layer weights and value zeroing: full mode's alone
        full_only = 0 if ctx.settings.quick else (len(ctx.ref.sites)
                                                  + (zeroing_left_out(ctx) is None))
        orderings = 1 + full_only + len(CONTRIBUTION_MEASURES) + len(ctx.settings.methods) + 3
        n_eligible = ctx.ref.eligible[ctx.rows.example, ctx.rows.step].sum(-1).tolist()
        per_row = row_bounds(n_eligible, orderings)
        budget = budget_per_example(ctx, per_row)
        notes: tuple[str, ...] = ()
        if budget is None:
            items = sum(per_row)
        else:
            spent: dict[int, int] = {}
            full: set[int] = set()  # the examples whose next row did not fit: no more rows
            taken = 0
            for example, row in zip(ctx.rows.example.tolist(), per_row, strict=True):
                if example in full or spent.get(example, 0) + row > budget:
                    full.add(example)
                    continue
                spent[example] = spent.get(example, 0) + row
                taken += 1
            items = sum(spent.values())
            if not ctx.settings.quick and taken < len(per_row):
                notes = (f"faithfulness: ~{taken} of {len(per_row)} rows (the cheapest row's "
                         f"bound: {min(per_row)} edited sources; {budget:.0f} fit per "
                         f"example)",)
        ref = ctx.ref
        chunk = whole_passes(ctx.target, vocab=int(ref.probs.shape[-1]),
                             keys=int(ref.batch.source_ids.shape[1]),
                             steps=int(ref.emitted.shape[1]), max_memory=ref.budget.max_memory)
        return Cost(items, -(-items // chunk) + 1, exact=False, sequences=items, notes=notes)

    def run(self, ctx: BatchContext) -> dict[str, pd.DataFrame]:
        ref, rows = ctx.ref, ctx.rows
        maps, missing = measure_maps(ctx)
        eligible = ref.eligible[rows.example, rows.step]
        orders = {name: ranking(values[rows.example, rows.step], eligible)
                  for name, values in maps.items()}
        global_example = (rows.example + ref.first_example).tolist()
        seeds = [row_seed(ref.seed, e, s) for e, s in zip(global_example, rows.step.tolist(),
                                                           strict=True)]
        orders[RANDOM] = random_ranking(eligible, seeds)
        # bound only: the reversed leave-one-out ranking approximates the worst ordering
        bound = reversed_ranking(orders["leave_one_out"], eligible)
        names = list(orders)
        stacked = torch.stack([*orders.values(), bound], dim=1)  # (N, O + 1, n)
        budget = budget_per_example(ctx, row_bounds(eligible.sum(-1).tolist(),
                                                    stacked.shape[1]))
        kept = rows_within(rows, eligible, stacked, budget, [s + ORDER_SALT for s in seeds])
        if ctx.facts is not None:
            ctx.facts["rows_offered"] = ctx.facts.get("rows_offered", 0) + len(rows)
            ctx.facts["rows_measured"] = ctx.facts.get("rows_measured", 0) + len(kept)
            if budget is not None:
                ctx.facts["budget"] = min(budget, ctx.facts.get("budget", budget))
        rows, eligible, stacked = rows.select(kept), eligible[kept], stacked[kept]
        global_example = [global_example[i] for i in kept.tolist()]
        token = replacement_id(ctx.target, ctx.batch, "pad")
        curves = removal_curves(ctx.target, ref, rows, stacked, token,
                                progress=ctx.settings.progress)
        comp, suff = aopc(curves.comprehensiveness), aopc(curves.sufficiency)
        scores = {"aopc_comprehensiveness": comp, "aopc_sufficiency": suff,
                  "normalised_aopc_comprehensiveness": normalised(comp, True),
                  "normalised_aopc_sufficiency": normalised(suff, False)}
        bounds = {f"aopc_{kind}_bound_{end}": reduce(values, -1).values
                  for kind, values in (("comprehensiveness", comp), ("sufficiency", suff))
                  for end, reduce in (("low", torch.min), ("high", torch.max))}
        frames = []
        for o, name in enumerate(names):
            frame: dict[str, Any] = {
                "example": np.asarray(global_example, dtype=np.int64),
                "step": rows.step.numpy(), "measure": name,
                "n_eligible": eligible.sum(-1).numpy(), "p_full": curves.p_full.numpy()}
            for f, fraction in enumerate(FRACTIONS):
                frame[f"comprehensiveness_{fraction}"] = curves.comprehensiveness[:, o, f].numpy()
                frame[f"sufficiency_{fraction}"] = curves.sufficiency[:, o, f].numpy()
            frame.update({score: values[:, o].numpy() for score, values in scores.items()})
            frame.update({name: values.numpy() for name, values in bounds.items()})
            frame["baseline"] = baseline_text(token)
            frames.append(pd.DataFrame(frame, columns=list(ROW_COLUMNS)))
        if ctx.facts is not None:
            ctx.facts.update(not_computed=missing, token=token,
                             measures=names, sites=list(ref.sites))
            ctx.facts["forward_sequences"] = (ctx.facts.get("forward_sequences", 0)
                                              + curves.forward_sequences)
        return {"faithfulness_rows": pd.concat(frames, ignore_index=True)}

    def assemble(self, parts: Mapping[str, pd.DataFrame], tables: Mapping[str, pd.DataFrame]
                 ) -> dict[str, pd.DataFrame]:
        rows = parts["faithfulness_rows"]
        return {"faithfulness_rows": rows, "faithfulness_summary": summarise(rows)}

    def checklist_lines(self, tables: Mapping[str, pd.DataFrame]) -> list[ChecklistLine]:
        summary = table_with(tables, "faithfulness_summary", "aopc_comprehensiveness")
        if summary is None:
            return []
        parts = [f"{r.measure} {r.aopc_comprehensiveness:.3g}"
                 for r in summary.itertuples(index=False)]
        return [("AOPC comprehensiveness (drop in the audited token's probability when each "
                 "measure's top source tokens are replaced, mean over 1-50 % removal) — "
                 + "; ".join(parts) + ".", "causal_explanation")]

    def metadata(self, settings: SuiteSettings, examples: set[int] | None,
                 facts: Mapping[str, Any]) -> dict[str, object]:
        return {"faithfulness_examples": "all" if examples is None else sorted(examples),
                "faithfulness_measures": list(facts.get("measures", [])),
                "faithfulness_layers": {} if settings.quick else {
                    f"weights:layer{i}": s for i, s in enumerate(facts.get("sites", []))},
                "faithfulness_fractions_percent": list(FRACTIONS),
                "faithfulness_bins": "k = min(n, max(1, ceil(f/100 * n))) of the row's n "
                                     "eligible source keys",
                "faithfulness_baseline": baseline_text(facts["token"]) if "token" in facts
                else "not run",
                "faithfulness_forward_sequences": facts.get("forward_sequences", 0),
                "faithfulness_budget": budget_text(settings, facts),
                "faithfulness_rows_measured": (f"{facts.get('rows_measured', 0)} of "
                                               f"{facts.get('rows_offered', 0)}"),
                "faithfulness_quick_omits": [*QUICK_OMITTED, ZEROING, "weights:layer<i>"]
                if settings.quick else [],
                "faithfulness_not_computed": dict(facts.get("not_computed", {}))}


def row_bounds(n_eligible: list[int], orderings: int) -> list[int]:
    """Per row with ``n_eligible`` keys, the most edited sources its curves run with
    ``orderings`` orderings: per distinct bin size k, at most one edited pair per ordering
    and per k-subset."""
    return [2 * sum(min(orderings, math.comb(n, k)) for k in set(bin_sizes(n)))
            for n in n_eligible]


def budget_per_example(ctx: BatchContext, bounds: list[int]) -> float | None:
    """The edited sources each measured example of the batch may run (None: every row):
    in quick mode :data:`QUICK_SEQUENCES_PER_EXAMPLE` per audited example, or what
    :data:`QUICK_MULTIPLY_ADDS` buy at the model's parameters x the batch's tokens per
    sequence (source + steps) if more, split evenly over the examples quick measures; in
    full mode what the work budget buys per example, or None where every example's rows
    fit it (``bounds``: :func:`row_bounds` of ``ctx.rows``) or there is no budget."""
    settings = ctx.settings
    per_sequence = max(ctx.sequence_multiply_adds(), 1.0)
    if not settings.quick:
        if math.isinf(settings.work_budget):
            return None
        budget = settings.work_budget / per_sequence
        spent: dict[int, int] = {}
        for example, bound in zip(ctx.rows.example.tolist(), bounds, strict=True):
            spent[example] = spent.get(example, 0) + bound
        return None if max(spent.values(), default=0) <= budget else budget
    sequences = max(QUICK_SEQUENCES_PER_EXAMPLE * settings.n_examples,
                    QUICK_MULTIPLY_ADDS / per_sequence)
    return sequences / min(QUICK_EXAMPLES, settings.n_examples)


def budget_text(settings: SuiteSettings, facts: Mapping[str, Any]) -> str:
    """The budget the faithfulness rows were measured under, in words."""
    held = f"; {facts['budget']:.0f} per measured example" if "budget" in facts else ""
    if not settings.quick:
        if math.isinf(settings.work_budget):
            return "none: every row of every example (full mode)"
        if facts.get("rows_measured", 0) == facts.get("rows_offered", 0):
            return (f"full: every row of every example (the work budget, "
                    f"{settings.work_budget:.0e} multiply-adds per example, held them all)")
        return (f"full: edited sources per example, as many as the work budget "
                f"({settings.work_budget:.0e} multiply-adds per example, parameters x tokens "
                f"per sequence) buys{held}; each example's rows in a seeded order, as many as "
                f"fit")
    return (f"quick: edited sources per measured example, {QUICK_SEQUENCES_PER_EXAMPLE} per "
            f"audited example or {QUICK_MULTIPLY_ADDS:.0e} multiply-adds (parameters x "
            f"tokens per sequence), whichever buys more, split over the measured examples"
            f"{held}; each example's rows in a seeded order, as many as fit")


def baseline_text(token: int) -> str:
    return f"token id {token} (the pad token, as leave-one-out) in place of each removed key"


def summarise(rows: pd.DataFrame) -> pd.DataFrame:
    """Per measure (first-seen order): the mean of every score over rows, with its 95 %
    bootstrap interval over examples (:func:`~attnaudit.analysis.bootstrap.bootstrap_interval`)."""
    records = []
    for measure, group in rows.groupby("measure", sort=False):
        record: dict[str, Any] = {"measure": measure,
                                  "examples": int(group["example"].nunique()),
                                  "rows": len(group)}
        for score in SCORES:
            record.update(bootstrap_interval(group[score].to_numpy(),
                                             group["example"].to_numpy()).columns(score))
        record["baseline"] = str(group["baseline"].iloc[0])
        records.append(record)
    return pd.DataFrame(records, columns=list(SUMMARY_COLUMNS))
