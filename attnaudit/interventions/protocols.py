"""The built-in intervention protocols, one class each, registered in the order the suite
runs them and lists their tables, summary rows and checklist lines (docs/metrics.md names).

Each wraps the test of its own module (:mod:`~attnaudit.interventions.permutation`,
:mod:`~attnaudit.interventions.ablation`, :mod:`~attnaudit.interventions.values`,
:mod:`~attnaudit.interventions.sequence`, :mod:`~attnaudit.interventions.adversarial`);
the attribution protocol registers from :mod:`attnaudit.auditing.attribution_protocol`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import torch

from attnaudit.interventions.ablation import (
    RANDOM_DRAWS,
    REMOVAL_ROUND,
    cumulative_summary,
    cumulative_test,
    random_other_key,
    uniform_test,
    zeroing_flip_table,
    zeroing_test,
)
from attnaudit.interventions.adversarial import (
    CANDIDATES,
    EPS_SEQ2SEQ,
    LEAST_ADVERSARIAL_STEPS,
    STEPS,
    adversarial_search,
)
from attnaudit.interventions.permutation import (
    SHARP_ATTENTION,
    SMALL_TVD,
    permutation_summary,
    permutation_test,
)
from attnaudit.interventions.protocol import (
    FULL,
    ROWS,
    SUBSET,
    BatchContext,
    ChecklistLine,
    Columns,
    Cost,
    InterventionProtocol,
    SuiteSettings,
    SummaryRow,
    interval_row,
    rate,
    seeded_examples,
    table_with,
    tvd_and_flip,
)
from attnaudit.interventions.reference_run import Reference
from attnaudit.interventions.registry import register_protocol
from attnaudit.interventions.runner import item_chunks, key_level_top
from attnaudit.interventions.sequence import SEQUENCE_PROTOCOLS, sequence_effects
from attnaudit.interventions.values import (
    merge_controls,
    other_example_items,
    unreachable,
    value_replacement,
)

SEQUENCE = "sequence_effects"  # its name: the permutation test keeps its median draw for it
# random removal orders per row of a quick audit's cumulative test (a full one: RANDOM_DRAWS);
# the random orders are the ones that flip last, most of the test's cached steps
QUICK_RANDOM_DRAWS = 2


def _passes(ref: Reference, step: torch.Tensor, *, grad: bool = False) -> int:
    """Forward passes :func:`~attnaudit.interventions.runner.run_items` makes for items at
    ``step`` (M,): its chunks, from the same budget."""
    return sum(1 for _ in item_chunks(ref, step, grad=grad))


def _steps_with_another_key(ctx: BatchContext) -> torch.Tensor:
    """The steps of ``ctx``'s rows that have a random other eligible key to edit (a row with
    one eligible key has none and is left out of the random-key edits)."""
    n_valid = ctx.ref.eligible[ctx.rows.example, ctx.rows.step].sum(-1)
    return ctx.rows.step[n_valid > 1]


def _items_at(ctx: BatchContext, copies: int) -> Cost:
    """``copies`` edited items per row of ``ctx``, run by ``run_items``."""
    step = ctx.rows.step.repeat_interleave(copies)
    return Cost(len(step), _passes(ctx.ref, step))


@register_protocol
class Permutation(InterventionProtocol):
    """Shuffle each row's weights among its eligible keys (Jain & Wallace)."""

    name = "permutation"
    columns: ClassVar[Columns] = {ROWS: ("perm_median_tvd", "perm_median_jsd", "perm_flip_rate")}

    def run(self, ctx: BatchContext) -> dict[str, pd.DataFrame]:
        return {ROWS: permutation_test(ctx.target, ctx.ref, ctx.rows,
                                       n_permutations=ctx.settings.n_permutations,
                                       progress=ctx.settings.progress,
                                       median_draw=SEQUENCE in ctx.running)}

    def cost(self, ctx: BatchContext) -> Cost:
        return _items_at(ctx, ctx.settings.n_permutations)

    def assemble(self, parts: Mapping[str, pd.DataFrame], tables: Mapping[str, pd.DataFrame]
                 ) -> dict[str, pd.DataFrame]:
        return {"permutation_bins": permutation_summary(tables[ROWS])}

    def summary(self, tables: Mapping[str, pd.DataFrame]) -> list[SummaryRow]:
        rows = tables[ROWS]
        tvd, examples = rows["perm_median_tvd"], rows["example"]
        return [interval_row("perm_median_tvd", tvd, examples,
                             "median over rows of the per-row median over permutations",
                             statistic=np.median, rows=len(rows)),
                interval_row("perm_small_tvd_share", (tvd < SMALL_TVD).where(tvd.notna()),
                             examples, f"share of rows with perm_median_tvd < {SMALL_TVD}",
                             rows=len(rows)),
                interval_row("perm_flip_rate", rows["perm_flip_rate"], examples,
                             "token flip rate over rows and permutations", rows=len(rows))]

    def checklist_lines(self, tables: Mapping[str, pd.DataFrame]) -> list[ChecklistLine]:
        perm = table_with(tables, ROWS, "perm_median_tvd")
        if perm is None:
            return []
        share = float((perm["perm_median_tvd"] < SMALL_TVD).mean())
        lines = [(f"Permutation: for {share:.0%} of {len(perm)} rows, shuffling the weights "
                  "among eligible keys changes the output distribution by a median TVD below "
                  f"{SMALL_TVD}.", "causal_explanation")]
        sharp = perm[perm["max_attention"] > SHARP_ATTENTION]
        if len(sharp):
            lines.append((f"Rows whose largest weight exceeds {SHARP_ATTENTION} ({len(sharp)}): "
                          f"median permutation TVD {sharp['perm_median_tvd'].median():.3g}; "
                          f"{(sharp['perm_median_tvd'] < SMALL_TVD).mean():.0%} of them "
                          f"below {SMALL_TVD}.", "sharp_is_correct"))
        return lines

    def metadata(self, settings: SuiteSettings, examples: set[int] | None,
                 facts: Mapping[str, Any]) -> dict[str, object]:
        return {"n_permutations": settings.n_permutations}


@register_protocol
class Uniform(InterventionProtocol):
    """Uniform weights over the eligible keys (Wiegreffe & Pinter)."""

    name = "uniform"
    columns: ClassVar[Columns] = {ROWS: ("uniform_tvd", "uniform_jsd", "uniform_flip",
                                         "uniform_mass_tvd", "uniform_mass_flip")}

    def run(self, ctx: BatchContext) -> dict[str, pd.DataFrame]:
        return {ROWS: uniform_test(ctx.target, ctx.ref, ctx.rows,
                                   progress=ctx.settings.progress)}

    def cost(self, ctx: BatchContext) -> Cost:
        return _items_at(ctx, 2)  # the paper's uniform and the eligible-mass variant

    def summary(self, tables: Mapping[str, pd.DataFrame]) -> list[SummaryRow]:
        return tvd_and_flip(tables[ROWS], "uniform")

    def checklist_lines(self, tables: Mapping[str, pd.DataFrame]) -> list[ChecklistLine]:
        rows = table_with(tables, ROWS, "uniform_flip")
        if rows is None:
            return []
        return [(f"Uniform weights over the eligible keys: mean output TVD "
                 f"{rows['uniform_tvd'].mean():.3g}, argmax flips in "
                 f"{rate(rows['uniform_flip']):.0%} of {len(rows)} rows.", "causal_explanation")]


@register_protocol
class Zeroing(InterventionProtocol):
    """Zero the top-weighted key, or a random other eligible key (Serrano & Smith)."""

    name = "zeroing"
    columns: ClassVar[Columns] = {ROWS: ("zero_top_tvd", "zero_top_flip", "zero_random_tvd",
                                         "zero_random_flip", "zero_weight_difference")}

    def run(self, ctx: BatchContext) -> dict[str, pd.DataFrame]:
        return {ROWS: zeroing_test(ctx.target, ctx.ref, ctx.rows,
                                   progress=ctx.settings.progress)}

    def cost(self, ctx: BatchContext) -> Cost:
        step = _steps_with_another_key(ctx).repeat_interleave(2)
        return Cost(len(step), _passes(ctx.ref, step))

    def assemble(self, parts: Mapping[str, pd.DataFrame], tables: Mapping[str, pd.DataFrame]
                 ) -> dict[str, pd.DataFrame]:
        return {"zeroing_flips": zeroing_flip_table(
            tables[ROWS].dropna(subset=["zero_top_flip"]))}

    def summary(self, tables: Mapping[str, pd.DataFrame]) -> list[SummaryRow]:
        return tvd_and_flip(tables[ROWS], "zero_top") + tvd_and_flip(tables[ROWS],
                                                                     "zero_random")

    def checklist_lines(self, tables: Mapping[str, pd.DataFrame]) -> list[ChecklistLine]:
        rows = table_with(tables, ROWS, "zero_top_flip")
        if rows is None:
            return []
        return [(f"Zeroing the top-weighted key flips the argmax in "
                 f"{rate(rows['zero_top_flip']):.0%} of rows; zeroing a random other eligible "
                 f"key in {rate(rows['zero_random_flip']):.0%}.", "larger_score")]


@register_protocol
class ValueReplacement(InterventionProtocol):
    """Replace the value at the top-weighted key and at a random one (zero, mean: weight
    edits; another example's: a value edit where capture holds the values, else not
    reachable, with each site's reason)."""

    name = "values"
    columns: ClassVar[Columns] = {ROWS: ("value_zero_tvd", "value_zero_flip", "value_mean_tvd",
                      "value_mean_flip"),
               "value_controls": ("control", "status", "reason", "n")}
    row_tables = (ROWS,)

    def run(self, ctx: BatchContext) -> dict[str, pd.DataFrame]:
        values, controls = value_replacement(ctx.target, ctx.ref, ctx.rows,
                                             progress=ctx.settings.progress)
        return {ROWS: values, "value_controls": controls}

    def cost(self, ctx: BatchContext) -> Cost:
        # one run: zero and mean at the top key of every row, then at the random other key
        # of the rows that have one (as value_replacement orders its items); then, where
        # reachable, one pass for the donors' values and a run of the other-example items
        at_random = _steps_with_another_key(ctx)
        step = torch.cat([ctx.rows.step, ctx.rows.step, at_random, at_random])
        cost = Cost(len(step), _passes(ctx.ref, step))
        if unreachable(ctx.ref) is not None:
            return cost
        top = key_level_top(ctx.ref, ctx.rows)
        others = other_example_items(ctx.ref, ctx.rows, top,
                                     random_other_key(ctx.ref, ctx.rows, top))
        other_step = ctx.rows.step[torch.cat([at for _, at, _, _ in others])]
        if not len(other_step):
            return cost
        return cost + Cost(len(other_step), _passes(ctx.ref, other_step) + 1)

    def assemble(self, parts: Mapping[str, pd.DataFrame], tables: Mapping[str, pd.DataFrame]
                 ) -> dict[str, pd.DataFrame]:
        return {"value_controls": merge_controls(parts["value_controls"], tables[ROWS])}

    def summary(self, tables: Mapping[str, pd.DataFrame]) -> list[SummaryRow]:
        return tvd_and_flip(tables[ROWS], "value_zero") + tvd_and_flip(tables[ROWS],
                                                                       "value_mean")

    def checklist_lines(self, tables: Mapping[str, pd.DataFrame]) -> list[ChecklistLine]:
        rows = table_with(tables, ROWS, "value_zero_tvd")
        if rows is None:
            return []
        controls = [c[len("value_"):-len("_tvd")] for c in rows.columns
                    if c.startswith("value_") and c.endswith("_tvd")]
        status = tables.get("value_controls")
        unreached = set() if status is None or "status" not in status.columns else set(
            status.loc[status["status"] != "run", "control"])
        parts = [f"{c}: not reachable (value_controls says why)" if c in unreached
                 else f"{c}: mean TVD {rows[f'value_{c}_tvd'].mean():.3g}"
                 + (f", flips {rate(rows[f'value_{c}_flip']):.0%}"
                    if f"value_{c}_flip" in rows.columns else "") for c in controls]
        return [("Value replacement at the top-weighted key — " + "; ".join(parts)
                 + ". This tests whether that position's content mattered, not whether the "
                 "weight was right.", "larger_score")]


@register_protocol
@dataclass(frozen=True)
class CumulativeRemoval(InterventionProtocol):
    """Remove keys in each order until the argmax flips, on a seeded subset of examples
    (``random_draws`` random orders per row, at most :data:`QUICK_RANDOM_DRAWS` in a quick
    audit)."""

    random_draws: int = RANDOM_DRAWS
    name: ClassVar[str] = "cumulative"
    columns: ClassVar[Columns] = {
        "cumulative": ("example", "step", "order", "flipped", "keys_removed", "frac_keys",
                       "frac_mass")}
    scope: ClassVar[str] = SUBSET
    row_tables: ClassVar[tuple[str, ...]] = ("cumulative",)

    def examples(self, settings: SuiteSettings) -> set[int] | None:
        return seeded_examples(settings.n_examples, settings.cumulative_examples,
                               settings.seed)

    def draws(self, settings: SuiteSettings) -> int:
        """The random orders per row this audit runs."""
        return min(self.random_draws, QUICK_RANDOM_DRAWS) if settings.quick \
            else self.random_draws

    def run(self, ctx: BatchContext) -> dict[str, pd.DataFrame]:
        return {"cumulative": cumulative_test(ctx.target, ctx.ref, ctx.rows,
                                              random_draws=self.draws(ctx.settings),
                                              progress=ctx.settings.progress)}

    def cost(self, ctx: BatchContext) -> Cost:
        """An estimate: the first round of removals, at most :data:`REMOVAL_ROUND` per row
        and order (each further round runs only where none flipped the argmax; the most is
        n_valid - 1), and the gradient pass of the gradient orders."""
        n_valid = ctx.ref.eligible[ctx.rows.example, ctx.rows.step].sum(-1)
        removals = (n_valid - 1).clamp(0, REMOVAL_ROUND) * (3 + self.draws(ctx.settings))
        step = ctx.rows.step.repeat_interleave(removals)
        gradient = _passes(ctx.ref, ctx.rows.step, grad=True)
        return Cost(len(step), _passes(ctx.ref, step) + gradient, gradient, exact=False)

    def assemble(self, parts: Mapping[str, pd.DataFrame], tables: Mapping[str, pd.DataFrame]
                 ) -> dict[str, pd.DataFrame]:
        if "cumulative" not in parts:
            return {}
        return {"cumulative": parts["cumulative"],
                "cumulative_summary": cumulative_summary(parts["cumulative"])}

    def checklist_lines(self, tables: Mapping[str, pd.DataFrame]) -> list[ChecklistLine]:
        summary = table_with(tables, "cumulative_summary", "frac_keys_median")
        if summary is None:
            return []
        parts = [f"{r.order}: median {r.frac_keys_median:.3g} of the keys "
                 f"({r.never_flipped} of {r.n} never flipped)"
                 for r in summary.itertuples(index=False)]
        return [("Cumulative removal until the argmax flips — " + "; ".join(parts) + ".", "")]

    def metadata(self, settings: SuiteSettings, examples: set[int] | None,
                 facts: Mapping[str, Any]) -> dict[str, object]:
        return {"cumulative_examples": sorted(examples or ()),
                "cumulative_random_draws": self.draws(settings)}


@register_protocol
class SequenceEffects(InterventionProtocol):
    """Decode again with the uniform, zeroing and median permutation edits held at every
    step (only when the suite is asked for ``sequence_effects``)."""

    name = SEQUENCE
    columns: ClassVar[Columns] = {SEQUENCE: ("example", "step", "protocol", "exact_match",
                                             "edit_distance")}
    after = ("permutation",)
    row_tables = ()  # the uniform edit's re-decodings are per example (step -1)

    def enabled(self, settings: SuiteSettings) -> bool:
        return settings.sequence_effects

    def run(self, ctx: BatchContext) -> dict[str, pd.DataFrame]:
        perm = (ctx.earlier or {}).get("permutation", {}).get(ROWS)
        draws = None if perm is None else perm["perm_median_draw"].to_numpy()
        return {SEQUENCE: sequence_effects(ctx.target, ctx.ref, ctx.rows, perm_median_draw=draws,
                                           n_permutations=ctx.settings.n_permutations,
                                           progress=ctx.settings.progress)}

    def summary(self, tables: Mapping[str, pd.DataFrame]) -> list[SummaryRow]:
        """Per sequence protocol: the exact-match share and the mean token edit distance."""
        table, out = tables.get(SEQUENCE), []
        if table is None:
            return []
        held = "re-decoded with the edit held at every step"
        for protocol in SEQUENCE_PROTOCOLS:
            part = table[table["protocol"] == protocol]
            if part.empty:
                continue
            out.append(interval_row(f"seq_{protocol}_exact_match",
                                    part["exact_match"].astype(bool), part["example"],
                                    f"share of outputs unchanged, {held}", rows=len(part)))
            out.append(interval_row(f"seq_{protocol}_edit_distance", part["edit_distance"],
                                    part["example"],
                                    f"mean token edit distance to the unedited output, {held}",
                                    rows=len(part)))
        return out

    def checklist_lines(self, tables: Mapping[str, pd.DataFrame]) -> list[ChecklistLine]:
        table = table_with(tables, SEQUENCE, "exact_match")
        if table is None:
            return []
        parts = [f"{protocol}: {rate(group['exact_match']):.0%} of {len(group)} unchanged, "
                 f"mean edit distance {group['edit_distance'].mean():.3g} tokens"
                 for protocol, group in table.groupby("protocol", sort=False)]
        return [("Decoded again with the edit held at every step, the returned text — "
                 + "; ".join(parts) + ".", "causal_explanation")]

    def metadata(self, settings: SuiteSettings, examples: set[int] | None,
                 facts: Mapping[str, Any]) -> dict[str, object]:
        return {SEQUENCE: settings.sequence_effects}


@register_protocol
@dataclass(frozen=True)
class AdversarialSearch(InterventionProtocol):
    """Search for very different weights that keep the output (full mode, seeded subset)."""

    steps: int = STEPS
    name: ClassVar[str] = "adversarial"
    columns: ClassVar[Columns] = {
        "adversarial": ("example", "step", "eps_max_jsd", "n_within_eps", "min_tvd"),
        "adversarial_candidates": ("example", "step", "candidate", "jsd_to_original",
                                   "output_tvd")}
    scope: ClassVar[str] = SUBSET
    modes: ClassVar[frozenset[str]] = frozenset({FULL})
    row_tables: ClassVar[tuple[str, ...]] = ("adversarial", "adversarial_candidates")

    def examples(self, settings: SuiteSettings) -> set[int] | None:
        return seeded_examples(settings.n_examples, settings.adversarial_examples,
                               settings.seed + 1)

    def budgeted_steps(self, ctx: BatchContext) -> int | None:
        """Adam steps on ``ctx``'s rows: :attr:`steps`, or as many as the work budget buys
        per searched example (a step: a forward and a backward one-token pass of every
        candidate of the example's rows) if that is at least :data:`LEAST_ADVERSARIAL_STEPS`
        (a shorter search barely leaves its random start), else None: the search does not
        run."""
        rows = ctx.rows
        per_example = int(torch.bincount(rows.example).max()) if len(rows) else 0
        steps = ctx.affordable(self.steps, 2.0 * CANDIDATES * per_example * ctx.parameters(), 0)
        return steps if steps >= min(LEAST_ADVERSARIAL_STEPS, self.steps) else None

    def run(self, ctx: BatchContext) -> dict[str, pd.DataFrame]:
        steps = self.budgeted_steps(ctx)
        if ctx.facts is not None:
            ctx.facts.setdefault("steps", set()).add(steps)
        if steps is None:  # the budget buys too short a search: none, and the metadata says so
            return {name: pd.DataFrame(columns=list(columns))
                    for name, columns in self.columns.items()}
        per_row, per_candidate = adversarial_search(ctx.target, ctx.ref, ctx.rows,
                                                    steps=steps,
                                                    progress=ctx.settings.progress)
        return {"adversarial": per_row, "adversarial_candidates": per_candidate}

    def cost(self, ctx: BatchContext) -> Cost:
        """Every candidate of every row, :meth:`budgeted_steps` gradient steps each; a chunk
        of rows takes one forward and one backward pass per step."""
        rows, ref = ctx.rows, ctx.ref
        budgeted = self.budgeted_steps(ctx)
        steps = 0 if budgeted is None else budgeted
        longest = int(rows.step.max()) if len(rows) else 0
        per_chunk = max(1, ref.budget.sequences(ref.positions(longest), grad=True)
                        // CANDIDATES)
        passes = -(-len(rows) // per_chunk) * steps
        notes = ((f"adversarial: not run (fewer than {LEAST_ADVERSARIAL_STEPS} steps fit)",)
                 if budgeted is None else () if steps == self.steps
                 else (f"adversarial: {steps} of {self.steps} steps",))
        items = len(rows) * CANDIDATES * steps
        return Cost(items, passes, passes, exact=False, notes=notes, gradient_items=items)

    def summary(self, tables: Mapping[str, pd.DataFrame]) -> list[SummaryRow]:
        adv = table_with(tables, "adversarial", "eps_max_jsd")
        if adv is None:
            return []
        return [interval_row("eps_max_jsd", adv["eps_max_jsd"], adv["example"],
                             f"mean over rows of the adversarial subset, eps = {EPS_SEQ2SEQ}",
                             rows=len(adv))]

    def checklist_lines(self, tables: Mapping[str, pd.DataFrame]) -> list[ChecklistLine]:
        adversarial = table_with(tables, "adversarial", "eps_max_jsd")
        if adversarial is None:
            return []
        jsd = adversarial["eps_max_jsd"]
        return [(f"Adversarial attention ({len(jsd)} rows): eps-max JSD median "
                 f"{jsd.median():.3g}, mean {jsd.mean():.3g} (at most ln 2 = 0.693) between "
                 "the original weights and the most different weights found that keep the "
                 "output within the TVD bound.", "causal_explanation")]

    def metadata(self, settings: SuiteSettings, examples: set[int] | None,
                 facts: Mapping[str, Any]) -> dict[str, object]:
        return {"adversarial_examples": sorted(examples or ()), "adversarial_eps": EPS_SEQ2SEQ,
                "adversarial_steps": adversarial_steps_text(self.steps, facts.get("steps"),
                                                            settings.work_budget)}


def adversarial_steps_text(wanted: int, ran: set[int | None] | None,
                           work_budget: float) -> str:
    """The metadata's account of the adversarial search's Adam steps: ``wanted`` per row,
    ``ran``: the steps its batches took (None among them: a batch the budget left out;
    ``ran`` None: it did not run)."""
    rule = (f"the work budget ({work_budget:.0e} multiply-adds per searched example; a step "
            f"is a forward and a backward one-token pass of every candidate of its rows)")
    if not ran:
        return "not run"
    taken = sorted(s for s in ran if s is not None)
    if not taken:
        return (f"not run: {rule} buys fewer than {LEAST_ADVERSARIAL_STEPS} Adam steps, too "
                f"short a search (a larger work_budget runs it)")
    skipped = ("; not run on the batches whose rows it buys fewer than "
               f"{LEAST_ADVERSARIAL_STEPS} steps" if None in ran else "")
    if taken == [wanted]:
        return f"{wanted} Adam steps per row (Jain & Wallace's search){skipped}"
    return (f"{', '.join(map(str, taken))} of {wanted} Adam steps per row: as many as {rule} "
            f"buys, at least {LEAST_ADVERSARIAL_STEPS}; a shortened variant of Jain & "
            f"Wallace's search{skipped}")
