"""The whole intervention and attribution suite on one target, as tidy tables.

Variant reported (docs/metrics.md): the seq2seq protocol — teacher-force the model's own
output (greedy, or the hypothesis the target's decoding returns) and intervene at one target
step at a time, at every cross-attention site at once (``sites=`` narrows it); keys are
source positions; special source tokens and padding are not eligible and keep their weight
in place. "Attention" as one key-level distribution is the mean over the edited sites and
heads. The suite runs every registered protocol
(:func:`~attnaudit.interventions.registry.registered_protocols`): the built-in ones of
:mod:`attnaudit.interventions.protocols` — permutation, uniform, single zeroing and value
replacement on every row, the cumulative removal test and the adversarial search on seeded
subsets of examples (stated in ``InterventionSuite.metadata``), with ``sequence_effects``
the re-decoding with edits held (:mod:`attnaudit.interventions.sequence`) — and the
attribution protocol (:mod:`attnaudit.auditing.attribution_protocol`). It names none of
them: their tables, summary rows, progress counters and metadata come from their classes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Any

import pandas as pd

from attnaudit.alignments.pharaoh import Alignment
from attnaudit.analysis.bootstrap import BOOTSTRAP_LEVEL, BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED
from attnaudit.analysis.degenerate import degenerate_table, describe_counts, reason_counts
from attnaudit.attribution.options import METHODS, QUICK_OMITTED, AttributionOptions
from attnaudit.auditing import (  # noqa: F401  (they register their protocols)
    attribution_protocol,
    faithfulness_protocol,
)
from attnaudit.errors import InterventionError, TargetError
from attnaudit.interventions.permutation import N_PERMUTATIONS
from attnaudit.interventions.protocol import (
    BATCH,
    ROW_KEYS,
    ROWS,
    BatchContext,
    InterventionProtocol,
    SuiteSettings,
    SummaryRow,
    subset_rows,
)
from attnaudit.interventions.reference_run import Reference, reference
from attnaudit.interventions.registry import registered_protocols
from attnaudit.interventions.work_budget import WORK_BUDGET, budget_record
from attnaudit.runtime.distributed import SINGLE, Shard, TextsDigest
from attnaudit.runtime.progress import (
    advance,
    display,
    done_in,
    expect,
    phase,
    settle,
    split,
)
from attnaudit.runtime.progress import (
    part as progress_part,
)
from attnaudit.targets.checks import checked_target
from attnaudit.targets.contract import Batch, Seq2SeqTarget
from attnaudit.targets.decoding import describe_decoding

CUMULATIVE_EXAMPLES = 50
QUICK_PERMUTATIONS = 20
ADVERSARIAL_EXAMPLES = 2
SUITE = ""  # the suite's own tables (degenerate) among the protocols' parts

# (protocol name, table name) -> its frames, one per batch
_BatchParts = dict[tuple[str, str], list[pd.DataFrame]]
# The protocols the suite runs, each with its seeded examples (None: every example).
_Plan = list[tuple[InterventionProtocol, set[int] | None]]
# What the metadata says of the variant run (docs/metrics.md).
_PROTOCOL_NOTE = ("teacher-forced decoded output; one target step edited at a time; all listed "
                  "sites edited together; special and padding keys in place")
_ATTENTION_NOTE = "mean over the edited sites and heads (max_attention, top key, orders)"
# How the summary's and the explanation tables' *_low/*_high columns were computed.
BOOTSTRAP_NOTE = {"unit": "example", "resamples": BOOTSTRAP_RESAMPLES,
                  "level": BOOTSTRAP_LEVEL, "seed": BOOTSTRAP_SEED,
                  "interval": "percentile bootstrap (attnaudit.analysis.bootstrap)"}
SUMMARY_COLUMNS = ["metric", "value", "n", "variant", "value_low", "value_high"]


@dataclass
class InterventionSuite:
    """Tables (docs/metrics.md names) keyed by name, what was run on what, and the
    registered protocols the suite ran with (the checklist reads their lines)."""

    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    metadata: dict[str, object] = field(default_factory=dict)
    protocols: tuple[InterventionProtocol, ...] = field(default_factory=registered_protocols)

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


def run_suite(target: Seq2SeqTarget, *, quick: bool = False, limit: int | None = None,
              progress: bool = True, sites: Sequence[str] | None = None,
              heads: Sequence[int] | None = None,
              n_permutations: int | None = None,
              cumulative_examples: int = CUMULATIVE_EXAMPLES,
              adversarial_examples: int = ADVERSARIAL_EXAMPLES,
              max_memory: int | str | None = None, shard: Shard = SINGLE,
              attribution: AttributionOptions | None = None,
              sequence_effects: bool = False,
              gold: Sequence[Alignment] | None = None,
              first_reference: Reference | None = None,
              work_budget: float = WORK_BUDGET) -> InterventionSuite:
    """Run every registered intervention protocol (attribution and agreement among them) on
    ``target``'s data.

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
    gold: one gold alignment per example (:func:`attnaudit.alignments.gold.checked_gold`),
    scored as the target's ``gold_alignments`` are, in their place.
    first_reference: the first batch's reference run with these ``sites``, ``heads`` and
    ``max_memory``, when the caller has run it (an audit's plan), used in place of a new one.
    work_budget: the multiply-adds each budgeted protocol may spend per example
    (:mod:`attnaudit.interventions.work_budget`; ``math.inf``: none).
    """
    batches, settings, protocols, chosen, plan = suite_plan(
        target, quick=quick, limit=limit, progress=progress, n_permutations=n_permutations,
        cumulative_examples=cumulative_examples, adversarial_examples=adversarial_examples,
        attribution=attribution, sequence_effects=sequence_effects, gold=gold,
        work_budget=work_budget)
    target = checked_target(target)
    n_examples = settings.n_examples
    if shard.is_distributed:
        _agree_on_data(shard, batches)
    local: list[tuple[int, _BatchParts]] = []
    starts = [0, *accumulate(len(b) for b in batches)]
    ref = None
    facts: dict[str, dict[str, Any]] = {}  # protocol -> its facts, kept from batch to batch
    with display(n_examples, enabled=progress, name=f"interventions {target.name}"), \
            shard.together("the intervention suite"):
        phase("interventions")
        for index, batch in enumerate(batches):
            if not shard.owns(index):
                advance(len(batch))  # another rank's batch, run at the same time
                continue
            ref = first_reference if index == 0 and first_reference is not None else \
                reference(target, batch, sites=sites, heads=heads, first_example=starts[index],
                          max_memory=max_memory)
            first_reference = None  # released with the batch
            local.append((index, {}))
            _run_batch(target, ref, batch, local[-1][1], plan, settings, facts)
            settle()
    shared = (_reference_facts(ref), facts) if ref is not None else None
    parts, (ref_facts, facts) = _gathered(shard, local, shared)
    _check_rows_to_intervene_on(parts, n_examples)
    tables = _assemble(parts, plan)
    tables["summary"] = summary_table([row for p, _ in plan for row in p.summary(tables)])
    metadata: dict[str, object] = {
        "target": target.name,
        "examples": n_examples,
        "rows": len(tables[ROWS]),
        "sites": ref_facts["sites"],
        "heads": ref_facts["heads"],
        "edited_heads": "all" if heads is None else list(heads),
        "seed": target.seed,
        "protocol": _PROTOCOL_NOTE,
        "attention": _ATTENTION_NOTE,
        "quick": quick,
        "work_budget": budget_record(work_budget),
        "edited_items": ref_facts["edited_items"],
        "max_memory_bytes": ref_facts["max_memory_bytes"],
        "degenerate_rows": reason_counts(tables["degenerate"]),
        "decoding": describe_decoding(target.decoding),
        "protocols": [p.name for p, _ in plan],
        "bootstrap": BOOTSTRAP_NOTE,
    }
    for protocol in protocols:
        metadata.update(protocol.metadata(settings, chosen[protocol.name],
                                          facts.get(protocol.name, {})))
    return InterventionSuite(tables, metadata, protocols)


def summary_table(rows: Sequence[SummaryRow]) -> pd.DataFrame:
    """The ``summary`` table (SUMMARY_COLUMNS); a row without an interval gets NaN bounds."""
    nan = float("nan")
    return pd.DataFrame([(*row, nan, nan) if len(row) == 4 else row for row in rows],
                        columns=SUMMARY_COLUMNS)


def suite_plan(target: Seq2SeqTarget, *, quick: bool, limit: int | None, progress: bool,
               n_permutations: int | None, cumulative_examples: int,
               adversarial_examples: int, attribution: AttributionOptions | None,
               sequence_effects: bool, gold: Sequence[Alignment] | None = None,
               work_budget: float = WORK_BUDGET
               ) -> tuple[list[Batch], SuiteSettings, tuple[InterventionProtocol, ...],
                          dict[str, set[int] | None], _Plan]:
    """What :func:`run_suite` runs with these arguments: the batches, the settings, the
    registered protocols, each one's examples (an empty set: not run) and the protocols
    that run, with their examples (also read by :mod:`attnaudit.auditing.plan`)."""
    attribution = attribution or AttributionOptions()
    if n_permutations is None:
        n_permutations = QUICK_PERMUTATIONS if quick else N_PERMUTATIONS
    target = checked_target(target)
    attribution.check(target)
    batches = list(target.iter_batches(limit))
    n_examples = sum(len(b) for b in batches)
    if n_examples == 0:
        raise TargetError(f"target {target.name!r} yielded no examples to intervene on; "
                          "give it data (or a larger limit)")
    methods = attribution.methods or tuple(m for m in METHODS
                                           if not (quick and m in QUICK_OMITTED))
    settings = SuiteSettings(quick=quick, n_examples=n_examples, seed=target.seed,
                             n_permutations=n_permutations,
                             cumulative_examples=cumulative_examples,
                             adversarial_examples=adversarial_examples,
                             sequence_effects=sequence_effects, progress=progress,
                             attribution=attribution, methods=methods, gold=gold,
                             work_budget=work_budget)
    protocols = registered_protocols()
    chosen = {p.name: p.examples(settings) if p.enabled(settings) else set() for p in protocols}
    plan: _Plan = [(p, chosen[p.name]) for p in protocols
                   if p.enabled(settings) and chosen[p.name] != set()]
    return batches, settings, protocols, chosen, plan


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
    if len(gathered) > 1:  # counts and sets in the facts: every rank's batches
        ref_facts, facts = first_shared
        first_shared = (ref_facts, _merged_facts(facts, [s[1] for _, s in gathered if s]))
    parts: _BatchParts = {}
    for _, batch_parts in sorted((part for rank_parts, _ in gathered for part in rank_parts),
                                 key=lambda part: part[0]):
        for name, frames in batch_parts.items():
            parts.setdefault(name, []).extend(frames)
    return parts, first_shared


def _merged_facts(first: dict[str, dict[str, Any]], every: list[dict[str, dict[str, Any]]]
                  ) -> dict[str, dict[str, Any]]:
    """``first``'s facts with each integer (a count) summed and each set joined over
    ``every`` rank's facts; other values are the first rank's."""
    out = {name: dict(values) for name, values in first.items()}
    for name, values in out.items():
        for key, value in values.items():
            found = [f[name][key] for f in every if key in f.get(name, {})]
            if isinstance(value, set):
                values[key] = set().union(*found)
            elif isinstance(value, int) and not isinstance(value, bool):
                values[key] = sum(found)
    return out


def _check_rows_to_intervene_on(parts: _BatchParts, n_examples: int) -> None:
    """Raise InterventionError, saying why, when no batch had a row to intervene on."""
    if any(table == ROWS for _, table in parts):
        return
    degenerate = pd.concat(parts[(SUITE, "degenerate")], ignore_index=True)
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


def _run_batch(target: Seq2SeqTarget, ref: Reference, batch: Batch, parts: _BatchParts,
               plan: _Plan, settings: SuiteSettings, facts: dict[str, dict[str, Any]]
               ) -> None:
    """Run the planned protocols on one batch, their tables appended to ``parts`` and their
    facts for the metadata left in ``facts`` (protocol -> its ``ctx.facts``, the same dict
    on every batch). Row protocols get the batch's counted rows (their scope); a batch
    without one runs only the BATCH protocols."""
    parts[(SUITE, "degenerate")] = [degenerate_table(ref.reasons, ref.eligible,
                                                     ref.first_example)]
    counted = ref.rows()
    # the batch's share of the display, split evenly over the counters its protocols open
    split(len(batch), sum(p.progress_items(len(counted)) for p, _ in plan))
    running = frozenset(p.name for p, _ in plan)
    earlier: dict[str, dict[str, pd.DataFrame]] = {}
    shared: dict[str, Any] = {}
    for protocol, examples in plan:
        rows = counted if examples is None else subset_rows(ref, counted, examples)
        if protocol.scope != BATCH and not len(rows):
            continue
        ctx = BatchContext(target, batch, ref, rows, settings, running, earlier, shared,
                           facts.setdefault(protocol.name, {}))
        _expect(protocol, ctx)
        with progress_part(protocol.name):
            earlier[protocol.name] = protocol.run(ctx)
        _expect(protocol, ctx, ran=True)
        for table, frame in earlier[protocol.name].items():
            parts[(protocol.name, table)] = [frame]


def _expect(protocol: InterventionProtocol, ctx: BatchContext, *, ran: bool = False) -> None:
    """The protocol's units in the progress plan: what it did so far, its cost on this batch
    (unless it has ``ran`` on it: a bound may exceed what ran) and, for the examples after
    it, as many per example as so far (unknown cost: nothing until it has run)."""
    cost = None if ran else protocol.cost(ctx)
    done = done_in(protocol.name) + (cost.items if cost is not None else 0)
    seen = ctx.ref.first_example + len(ctx.batch)
    expect(protocol.name, done + done / seen * (ctx.settings.n_examples - seen))


def _assemble(parts: _BatchParts, plan: _Plan) -> dict[str, pd.DataFrame]:
    """The suite's tables: ``rows`` (every protocol's per-row columns joined on ROW_KEYS,
    in run order), ``degenerate``, then each protocol's own."""
    joined = {key: pd.concat(frames, ignore_index=True) for key, frames in parts.items()}
    per_row = [joined[(p.name, ROWS)] for p, _ in plan if (p.name, ROWS) in joined]
    rows = per_row[0]
    for frame in per_row[1:]:
        rows = rows.merge(frame, on=ROW_KEYS, how="left")
    tables = {ROWS: rows, "degenerate": joined[(SUITE, "degenerate")]}
    for protocol, _ in plan:
        own = {table: frame for (name, table), frame in joined.items()
               if name == protocol.name and table != ROWS}
        tables.update(protocol.assemble(own, tables))
    return tables
