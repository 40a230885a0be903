"""The whole intervention and attribution suite on one target, as tidy tables.

Variant reported (docs/metrics.md): the seq2seq protocol — teacher-force the model's own
output (greedy, or the hypothesis the target's decoding returns) and intervene at one target
step at a time, at every cross-attention site at once (``sites=`` narrows it); keys are
source positions; special source tokens and padding are not eligible and keep their weight
in place. "Attention" as one key-level distribution is the mean over the edited sites and
heads. Permutation, uniform, single zeroing and value replacement run on every row; the
cumulative removal test and the adversarial search run on seeded subsets of examples
(stated in ``InterventionSuite.metadata``). With ``sequence_effects``, the uniform, zeroing
and median permutation edits are also held while the sources are decoded again
(:mod:`attnaudit.interventions.sequence`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from attnaudit.analysis.degenerate import degenerate_table, describe_counts, reason_counts
from attnaudit.analysis.words import word_importance_table
from attnaudit.attribution.agreement import agreement, summarise_agreement
from attnaudit.attribution.loo import leave_one_out
from attnaudit.attribution.methods import attribute
from attnaudit.attribution.options import METHODS, AttributionOptions
from attnaudit.auditing.contribution_suite import add_contribution_parts, contribution_tables
from attnaudit.errors import InterventionError
from attnaudit.interventions.ablation import (
    cumulative_summary,
    cumulative_test,
    uniform_test,
    zeroing_flip_table,
    zeroing_test,
)
from attnaudit.interventions.adversarial import EPS_SEQ2SEQ, adversarial_search
from attnaudit.interventions.permutation import (
    N_PERMUTATIONS,
    SMALL_TVD,
    permutation_summary,
    permutation_test,
)
from attnaudit.interventions.reference_run import Reference, RowIndex, reference
from attnaudit.interventions.sequence import SEQUENCE_PROTOCOLS, sequence_effects
from attnaudit.interventions.values import value_replacement
from attnaudit.runtime.distributed import SINGLE, Shard, TextsDigest
from attnaudit.runtime.progress import advance, display, phase, settle, split
from attnaudit.targets.checks import checked_target
from attnaudit.targets.contract import Batch, Seq2SeqTarget
from attnaudit.targets.decoding import describe_decoding

CUMULATIVE_EXAMPLES = 50
QUICK_PERMUTATIONS = 20
ADVERSARIAL_EXAMPLES = 2
ROW_KEYS = ["example", "step", "n_valid", "max_attention"]

# table name -> its frames, one per batch (or per part of a batch)
_BatchParts = dict[str, list[pd.DataFrame]]
# What the metadata says of the variant run (docs/metrics.md).
_PROTOCOL_NOTE = ("teacher-forced decoded output; one target step edited at a time; all listed "
                  "sites edited together; special and padding keys in place")
_ATTENTION_NOTE = "mean over the edited sites and heads (max_attention, top key, orders)"


@dataclass
class InterventionSuite:
    """Tables (docs/metrics.md names) keyed by name, and what was run on what."""

    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    metadata: dict[str, object] = field(default_factory=dict)

    def write_csv(self, out: str | Path) -> list[Path]:
        """Write each table as ``<name>.csv`` under ``out``; return the paths."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        for name, table in self.tables.items():
            path = out / f"{name}.csv"
            table.to_csv(path, index=False)
            paths.append(path)
        return paths


def seeded_examples(n_examples: int, count: int, seed: int) -> set[int]:
    """``count`` global example indices out of ``n_examples``, drawn with ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    return set(torch.randperm(n_examples, generator=gen)[:count].tolist())


def _subset(ref: Reference, rows: RowIndex, chosen: set[int]) -> RowIndex:
    keep = torch.tensor([ref.first_example + int(e) in chosen for e in rows.example],
                        dtype=torch.bool)
    return rows.select(keep.nonzero().squeeze(1))


def _per_batch(parts: _BatchParts, name: str, frame: pd.DataFrame) -> None:
    parts.setdefault(name, []).append(frame)


def run_suite(target: Seq2SeqTarget, *, quick: bool = False, limit: int | None = None,
              progress: bool = True, sites: Sequence[str] | None = None,
              heads: Sequence[int] | None = None,
              n_permutations: int | None = None,
              cumulative_examples: int = CUMULATIVE_EXAMPLES,
              adversarial_examples: int = ADVERSARIAL_EXAMPLES,
              max_memory: int | str | None = None, shard: Shard = SINGLE,
              attribution: AttributionOptions | None = None,
              sequence_effects: bool = False) -> InterventionSuite:
    """Run every intervention, attribution and agreement statistic on ``target``'s data.

    quick skips the adversarial search and integrated gradients and draws
    ``QUICK_PERMUTATIONS`` permutations per row instead of 100 (unless ``n_permutations``
    is given). limit: first N examples. sites: edited sites (default every cross-attention
    site); heads: edit only these heads at each edited site (default all). max_memory: the
    budget of one chunk of edited sequences (bytes or "2GiB"). attribution: what the
    attribution methods attribute, their variant and which methods run (default: the
    probability, signed sums, pad baseline; saliency, input x gradient and, unless quick,
    integrated gradients). Batches are processed one at a time and only per-row tables are kept,
    so memory does not grow with the data.
    shard: this process's part of a distributed suite (:mod:`attnaudit.runtime.distributed`): it
    runs its own batches and every rank returns the whole suite, its tables gathered in
    batch order (the same tables as one process).
    sequence_effects: also decode each source again with the uniform, zeroing and median
    permutation edits held at every step, and table whether the returned text changed
    (``sequence_effects``; :mod:`attnaudit.interventions.sequence`).
    """
    attribution = attribution or AttributionOptions()
    if n_permutations is None:
        n_permutations = QUICK_PERMUTATIONS if quick else N_PERMUTATIONS
    target = checked_target(target)
    attribution.check(target)
    batches = list(target.iter_batches(limit))
    n_examples = sum(len(b) for b in batches)
    if n_examples == 0:
        raise ValueError("the target yielded no examples")
    cumulative_set = seeded_examples(n_examples, cumulative_examples, target.seed)
    adversarial_set = set() if quick else seeded_examples(n_examples, adversarial_examples,
                                                          target.seed + 1)
    methods = attribution.methods or tuple(m for m in METHODS
                                           if not (quick and m == "integrated_gradients"))
    if shard.is_distributed:
        _agree_on_data(shard, batches)
    local: list[tuple[int, _BatchParts]] = []
    starts = [0, *accumulate(len(b) for b in batches)]
    ref = None
    with display(n_examples, enabled=progress, name=f"interventions {target.name}"), \
            shard.together("the intervention suite"):
        phase("interventions")
        for index, batch in enumerate(batches):
            if not shard.owns(index):
                advance(len(batch))  # another rank's batch, run at the same time
                continue
            ref = reference(target, batch, sites=sites, heads=heads,
                            first_example=starts[index], max_memory=max_memory)
            local.append((index, {}))
            variants = _run_batch(target, ref, batch, local[-1][1], methods, n_permutations,
                                  cumulative_set, adversarial_set, progress, attribution,
                                  sequence_effects, zeroing=not quick)
            settle()
    shared = (_reference_facts(ref), variants) if ref is not None else None
    parts, (facts, attribution_variants) = _gathered(shard, local, shared)
    _check_rows_to_intervene_on(parts, n_examples)
    tables = _assemble(parts)
    tables["summary"] = _summary(tables)
    return InterventionSuite(tables, {
        "target": target.name,
        "examples": n_examples,
        "rows": len(tables["rows"]),
        "sites": facts["sites"],
        "heads": facts["heads"],
        "edited_heads": "all" if heads is None else list(heads),
        "seed": target.seed,
        "protocol": _PROTOCOL_NOTE,
        "attention": _ATTENTION_NOTE,
        "n_permutations": n_permutations,
        "cumulative_examples": sorted(cumulative_set),
        "adversarial_examples": sorted(adversarial_set),
        "adversarial_eps": EPS_SEQ2SEQ,
        "attribution_methods": list(methods),
        "attribution_variants": attribution_variants,
        "attribution_output": attribution.output,
        "quick": quick,
        "edited_items": facts["edited_items"],
        "max_memory_bytes": facts["max_memory_bytes"],
        "degenerate_rows": reason_counts(tables["degenerate"]),
        "decoding": describe_decoding(target.decoding),
        "sequence_effects": sequence_effects,
    })


def _agree_on_data(shard: Shard, batches: Sequence[Batch]) -> None:
    """Every rank must read the same batches in the same order (:meth:`Shard.agree`)."""
    data = TextsDigest()
    for batch in batches:
        data.update(batch.texts)
    shard.agree("data", data.hexdigest())


def _gathered(shard: Shard, local: list[tuple[int, _BatchParts]], shared: Any
              ) -> tuple[_BatchParts, Any]:
    """Every rank's per-batch tables joined in batch order (the single-process order), and
    the ``shared`` facts of the first rank that ran a batch."""
    gathered = shard.all_gather((local, shared))
    first_shared = next(shared for _, shared in gathered if shared is not None)
    parts: _BatchParts = {}
    for _, batch_parts in sorted((part for rank_parts, _ in gathered for part in rank_parts),
                                 key=lambda part: part[0]):
        for name, frames in batch_parts.items():
            parts.setdefault(name, []).extend(frames)
    return parts, first_shared


def _check_rows_to_intervene_on(parts: _BatchParts, n_examples: int) -> None:
    """Raise InterventionError, saying why, when no batch had a row to intervene on."""
    if "permutation" in parts:
        return
    degenerate = pd.concat(parts["degenerate"], ignore_index=True)
    if degenerate.empty:
        raise InterventionError(f"no row to intervene on: the greedy outputs of the "
                                f"{n_examples} examples have no step")
    raise InterventionError(
        f"no row to intervene on: all {len(degenerate)} rows of the {n_examples} "
        f"examples are degenerate ({describe_counts(reason_counts(degenerate))}); see "
        "attnaudit.analysis.degenerate")


def _reference_facts(ref: Reference) -> dict[str, Any]:
    """What the suite's metadata says of its references (the same for every batch)."""
    return {"sites": list(ref.sites), "heads": ref.heads,
            "edited_items": _edited_items(ref),
            "max_memory_bytes": ref.budget.max_memory}


def _edited_items(ref: Reference) -> str:
    """How edited items ran, in words: one cached step, or the prefix re-run (and why, when
    the target offered a cached step that could not be used)."""
    if ref.states is not None:
        return "one cached decoder step"
    if ref.cache_note is not None:
        return f"decoder prefix re-run ({ref.cache_note})"
    return "decoder prefix re-run"


def _run_batch(target: Seq2SeqTarget, ref: Reference, batch: Batch,
               parts: _BatchParts, methods: tuple[str, ...],
               n_permutations: int, cumulative_set: set[int], adversarial_set: set[int],
               progress: bool, attribution: AttributionOptions,
               sequence_effects: bool = False, *, zeroing: bool = True) -> dict[str, str]:
    """Run everything on one batch; returns each attribution method's variant in words.
    zeroing: compare value zeroing with the other measures too (one re-run per key)."""
    _per_batch(parts, "degenerate", degenerate_table(ref.reasons, ref.eligible,
                                                     ref.first_example))
    rows = ref.rows()
    # the batch's progress counters: the row protocols (when it has rows), attribution, and
    # leave-one-out; the cumulative and adversarial subsets are counted when drawn at all
    row_protocols = 4 + bool(cumulative_set) + bool(adversarial_set) + sequence_effects
    split(len(batch), 2 + (row_protocols if len(rows) else 0))
    if len(rows):
        _run_row_protocols(target, ref, rows, parts, n_permutations, cumulative_set,
                           adversarial_set, progress, sequence_effects)
    found = attribute(target, batch, ref.emitted, methods, progress=progress,
                      output=attribution.output, reduction=attribution.reduction,
                      baseline=attribution.baseline, target_side=attribution.target_side,
                      detach_attention=attribution.detach_attention,
                      contrast=attribution.contrast_ids(batch, ref.emitted, target.eos_id),
                      max_memory=ref.budget.max_memory, seed=ref.seed,
                      first_example=ref.first_example)
    loo = leave_one_out(target, batch, ref.emitted, reference_probs=ref.probs,
                        max_memory=ref.budget.max_memory, progress=progress)
    importances = {"attention": ref.attention, **found.importance, "loo": loo}
    if ref.first_example == 0:  # the first example, per source word (a bounded table)
        _per_batch(parts, "word_importance", word_importance_table(
            target, batch, ref.emitted, importances, ref.steps))
    rows_agree = agreement(importances, target.explain_keys(batch), ref.steps)
    rows_agree["example"] += ref.first_example
    _per_batch(parts, "agreement", rows_agree)  # before the contribution agreement
    add_contribution_parts(target, batch, ref, importances, parts, zeroing=zeroing)
    if found.convergence_delta is not None:
        delta = found.delta_frame()
        delta["example"] += ref.first_example
        _per_batch(parts, "attribution_delta", delta)
    if found.prefix_scores is not None:
        prefix = found.to_frame().query("side == 'prefix'").drop(columns="side")
        prefix["example"] += ref.first_example
        _per_batch(parts, "attribution_prefix", prefix)
    return {m: found.variant(m) for m in methods}


def _run_row_protocols(target: Seq2SeqTarget, ref: Reference, rows: RowIndex,
                       parts: _BatchParts, n_permutations: int,
                       cumulative_set: set[int], adversarial_set: set[int],
                       progress: bool, sequence: bool = False) -> None:
    """The per-row protocols on a batch's counted (not degenerate) rows."""
    run: dict[str, Callable[[], pd.DataFrame]] = {
        "permutation": lambda: permutation_test(target, ref, rows, n_permutations=n_permutations,
                                                progress=progress, median_draw=sequence),
        "uniform": lambda: uniform_test(target, ref, rows, progress=progress),
        "zeroing": lambda: zeroing_test(target, ref, rows, progress=progress),
    }
    for name, fn in run.items():
        _per_batch(parts, name, fn())
    if sequence:
        draws = parts["permutation"][-1]["perm_median_draw"].to_numpy()
        _per_batch(parts, "sequence_effects", sequence_effects(
            target, ref, rows, perm_median_draw=draws, n_permutations=n_permutations,
            progress=progress))
    values, controls = value_replacement(target, ref, rows, progress=progress)
    _per_batch(parts, "values", values)
    _per_batch(parts, "value_controls", controls)
    chosen = _subset(ref, rows, cumulative_set)
    if len(chosen):
        _per_batch(parts, "cumulative", cumulative_test(target, ref, chosen, progress=progress))
    chosen = _subset(ref, rows, adversarial_set)
    if len(chosen):
        per_row, per_candidate = adversarial_search(target, ref, chosen, progress=progress)
        _per_batch(parts, "adversarial", per_row)
        _per_batch(parts, "adversarial_candidates", per_candidate)


def _assemble(parts: _BatchParts) -> dict[str, pd.DataFrame]:
    joined = {name: pd.concat(frames, ignore_index=True) for name, frames in parts.items()}
    rows = joined.pop("permutation")
    for name in ("uniform", "zeroing", "values"):
        rows = rows.merge(joined.pop(name), on=ROW_KEYS, how="left")
    tables = {"rows": rows, "permutation_bins": permutation_summary(rows),
              "zeroing_flips": zeroing_flip_table(rows.dropna(subset=["zero_top_flip"]))}
    controls = joined.pop("value_controls")
    tables["value_controls"] = _merge_controls(controls, rows)
    if "cumulative" in joined:
        tables["cumulative"] = joined.pop("cumulative")
        tables["cumulative_summary"] = cumulative_summary(tables["cumulative"])
    tables.update(joined)
    tables["agreement_summary"] = summarise_agreement(tables["agreement"])
    tables.update(contribution_tables(tables))
    return tables


def _merge_controls(controls: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """One row per control over all batches (per-batch status rows re-aggregated)."""
    out = []
    for control, group in controls.groupby("control", sort=False):
        first = group.iloc[0]
        ran = first["status"] == "run"
        out.append({"control": control, "status": first["status"], "reason": first["reason"],
                    "n": int(group["n"].sum()),
                    "tvd_mean": rows[f"value_{control}_tvd"].mean() if ran else float("nan"),
                    "flip_rate": rows[f"value_{control}_flip"].mean() if ran else float("nan")})
    return pd.DataFrame(out)


def _example_mean(rows: pd.DataFrame, column: str) -> float:
    """Mean over steps within each example, then over examples (docs/metrics.md)."""
    return float(rows.dropna(subset=[column]).groupby("example")[column].mean().mean())


def _summary(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Scalar results: metric, value, n (rows counted), variant."""
    rows = tables["rows"]
    out = [
        ("perm_median_tvd", rows["perm_median_tvd"].median(), len(rows),
         "median over rows of the per-row median over permutations"),
        ("perm_small_tvd_share", (rows["perm_median_tvd"] < SMALL_TVD).mean(), len(rows),
         f"share of rows with perm_median_tvd < {SMALL_TVD}"),
        ("perm_flip_rate", rows["perm_flip_rate"].mean(), len(rows),
         "token flip rate over rows and permutations"),
    ]
    for prefix in ("uniform", "zero_top", "zero_random", "value_zero", "value_mean"):
        part = rows.dropna(subset=[f"{prefix}_tvd"])
        out.append((f"{prefix}_tvd", _example_mean(part, f"{prefix}_tvd"), len(part),
                    "mean over steps, then over examples"))
        out.append((f"{prefix}_flip", part[f"{prefix}_flip"].astype(bool).mean(), len(part),
                    "token flip rate"))
    if "sequence_effects" in tables:
        out.extend(_sequence_summary(tables["sequence_effects"]))
    if "adversarial" in tables:
        adv = tables["adversarial"]
        out.append(("eps_max_jsd", adv["eps_max_jsd"].mean(), len(adv),
                    f"mean over rows of the adversarial subset, eps = {EPS_SEQ2SEQ}"))
    if "attribution_delta" in tables:
        delta = tables["attribution_delta"]["convergence_delta"].abs()
        out.append(("convergence_delta_abs", delta.mean(), len(delta),
                    "integrated gradients, mean |delta| in probability units"))
    return pd.DataFrame(out, columns=["metric", "value", "n", "variant"])


def _sequence_summary(table: pd.DataFrame) -> list[tuple[str, float, int, str]]:
    """Per sequence protocol: the exact-match share and the mean token edit distance."""
    out = []
    for protocol in SEQUENCE_PROTOCOLS:
        part = table[table["protocol"] == protocol]
        if part.empty:
            continue
        held = "re-decoded with the edit held at every step"
        out.append((f"seq_{protocol}_exact_match", part["exact_match"].astype(bool).mean(),
                    len(part), f"share of outputs unchanged, {held}"))
        out.append((f"seq_{protocol}_edit_distance", part["edit_distance"].mean(), len(part),
                    f"mean token edit distance to the unedited output, {held}"))
    return out
