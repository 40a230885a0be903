"""The validity audit: is each attention site a valid weighted retrieval computation?

:func:`run_validity_audit` runs a :class:`~attnaudit.targets.contract.Seq2SeqTarget` over its data —
greedy decoding, then the model's own output teacher-forced under capture (docs/metrics.md's
seq2seq protocol) — and streams every record through the entropy, masking, numerics,
score and region analysers (:mod:`attnaudit.validity.analysers`), each site's rows under
the key rule declared for its role (:mod:`attnaudit.validity.rules`). It returns a
:class:`~attnaudit.validity.result.ValidityAudit`: tidy tables (sites:
:mod:`attnaudit.validity.sites`; performance: :mod:`attnaudit.validity.timing`) plus its
findings, the one source the CI gate (:mod:`attnaudit.validity.gate`), the pytest helper
(:mod:`attnaudit.testing`) and the report read.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import reduce
from typing import Any

import pandas as pd
import torch

from attnaudit.analysis import RegionAnalyser
from attnaudit.analysis.cached_decoding import (
    NOT_COMPARED,
    CachedDecoding,
    compare_cached_decoding,
)
from attnaudit.analysis.degenerate import DegenerateCounter
from attnaudit.analysis.example_maps import ExampleMaps, MapBuilder
from attnaudit.analysis.merging import merge_analyser
from attnaudit.analysis.words import source_words
from attnaudit.capturing.blocks import DEFAULT_MAX_MEMORY, parse_memory
from attnaudit.capturing.parity import ParityGap, parity_of, sampled
from attnaudit.errors import TargetError
from attnaudit.options import positive_count
from attnaudit.runtime.distributed import SINGLE, Shard, TextsDigest
from attnaudit.runtime.measurement import PERFORMANCE_COLUMNS, TIMING_REPEATS, capture_bytes
from attnaudit.runtime.progress import advance, display, phase
from attnaudit.targets.checks import call_target, checked_target
from attnaudit.targets.contract import Batch, Seq2SeqTarget
from attnaudit.targets.decoding import describe_decoding
from attnaudit.validity.analysers import (
    DEFAULT_MAX_MASKED_MASS,
    DEFAULT_ROW_SUM_TOLERANCE,
    ValidityAnalysers,
)
from attnaudit.validity.batch import BatchAnalysis
from attnaudit.validity.findings import summarise_sites
from attnaudit.validity.parity import merge_parity, with_parity
from attnaudit.validity.result import ValidityAudit
from attnaudit.validity.sites import (
    MATERIALISED_BY_CAPTURE,
    SiteFacts,
    merged_site_facts,
    sites_frame,
)
from attnaudit.validity.timing import (
    PlainPass,
    forward_passes,
    greedy_timed,
    kept_pass,
    performance_row,
)


@dataclass(frozen=True)
class _Options:
    """How each batch is audited (see :func:`run_validity_audit`'s arguments)."""

    timing: bool
    least_repeats: int  # the fewest runs of each timed pass
    checks_only: bool
    keep: int  # the examples whose maps are kept (0: none)
    streaming: bool
    max_memory: int
    first_greedy: tuple[torch.Tensor, float] | None = None  # batch 0's, already timed
    first_plain: PlainPass | None = None  # batch 0's pass without capture, already timed


@dataclass
class _AuditState:
    """What one rank's audit has gathered so far, batch after batch: the analysers (and
    one region analyser per expectation), the site facts, the performance rows, the
    degenerate rows, the first examples' maps, the number of examples and the cached
    decoding against the teacher-forced pass (not measured until a batch is)."""

    analysers: ValidityAnalysers
    regions: dict[str, RegionAnalyser]
    sites: dict[str, SiteFacts] = field(default_factory=dict)
    performance: list[dict[str, Any]] = field(default_factory=list)
    degenerate: DegenerateCounter = field(default_factory=DegenerateCounter)
    example: ExampleMaps | None = None
    examples: int = 0
    kept: list[ExampleMaps] = field(default_factory=list)
    cached: CachedDecoding = NOT_COMPARED
    parity: dict[str, ParityGap] = field(default_factory=dict)  # backend parity by site


def run_validity_audit(target: Seq2SeqTarget, *, limit: int | None = None,
                       progress: bool = True, keep_example: bool = True,
                       regions: bool = True, timing: bool = True,
                       timing_repeats: int = TIMING_REPEATS,
                       max_masked_mass: float = DEFAULT_MAX_MASKED_MASS,
                       row_sum_tolerance: float | None = DEFAULT_ROW_SUM_TOLERANCE,
                       checks_only: bool = False, shard: Shard = SINGLE,
                       keep_examples: int = 1, streaming: bool = True,
                       max_memory: int | str | None = None,
                       first_greedy: tuple[torch.Tensor, float] | None = None,
                       first_plain: PlainPass | None = None) -> ValidityAudit:
    """Audit every attention site of ``target`` over its data (see the module docstring).

    Args:
        target: the model and its data; the model is left unchanged.
        limit: audit only the first ``limit`` examples (>= 1).
        progress: a progress display on stderr (:mod:`attnaudit.runtime.progress`).
        keep_example: keep the first examples' attention maps (see ``keep_examples``).
        keep_examples: with ``keep_example``, keep the maps of the first ``keep_examples``
            examples (>= 1; the report's explorer draws them), batch after batch until there
            are that many, each gathered call by call when streaming and averaged past
            :data:`~attnaudit.analysis.example_maps.MAX_MAP_SIDE` positions: memory does not
            grow with the data or the sequence length.
        regions: measure the target's expectations (region_mass, top_weight_hit).
        timing: time greedy decoding and the forward without and with capture, repeated,
            and measure peak memory (:mod:`attnaudit.validity.timing`); without it no time
            is reported.
        timing_repeats: the fewest runs of a timed pass whose first run took
            :data:`~attnaudit.runtime.measurement.SLOW_PASS_S` or longer (a faster one runs
            at least :data:`~attnaudit.runtime.measurement.TIMING_REPEATS` times; more while
            they add up to less than :data:`~attnaudit.runtime.measurement.MIN_TIMED_S`); a
            quick audit asks for :data:`~attnaudit.runtime.measurement.QUICK_TIMING_REPEATS`.
        max_masked_mass, row_sum_tolerance: the tolerances failing rows are counted at;
            row_sum_tolerance None: per site from the weights' dtype and key count
            (:func:`attnaudit.analysis.numerics.row_sum_tolerance`).
        checks_only: only what the gate judges: capture without scores and values, the
            masking and numerics analysers only (no entropy, no score ranges), so the
            audit costs little more than the greedy decode and one teacher-forced pass.
            Otherwise, where the target offers ``cached_decode``, each batch's output is
            also decoded again step by step from the model's own cache and compared with
            the teacher-forced pass (:mod:`attnaudit.analysis.cached_decoding`).
        shard: this process's part of a distributed audit (:mod:`attnaudit.runtime.distributed`):
            it audits its own batches, and every rank returns the merged audit (the first
            examples' maps gathered from the ranks that kept them).
        streaming: analyse each attention call as capture hands it over and drop it
            (:mod:`attnaudit.validity.batch`), so memory holds one call (or query block) at
            a time, not every site's weights for a batch; False analyses a kept capture.
            The tables are the same either way.
        max_memory: bytes (or ``"2GiB"``) one query block of explicitly computed attention
            may use (:mod:`attnaudit.capturing.blocks`; default 1 GiB).
        first_greedy: the first batch's greedy output (B, T) and the seconds it took, when
            the caller already decoded it (the audit's plan, in its reference run): not
            decoded again, and its time is the first timed run.
        first_plain: the first batch's timed teacher-forced pass without capture (on
            ``first_greedy``'s output), when the caller already ran it: not run again
            (:func:`~attnaudit.validity.timing.forward_passes`).

    Raises:
        TargetError: the target's callables fail or return the wrong shapes, or there is
            no data; OptionError (a TargetError): ``limit`` or ``keep_examples`` is not a
            whole number >= 1. Capture errors (no attention found...) propagate.
    """
    positive_count("limit", limit)
    positive_count("keep_examples", keep_examples, optional=False)
    target = checked_target(target)
    state = _AuditState(ValidityAnalysers(max_masked_mass, row_sum_tolerance,
                                          checks_only=checks_only),
                        {e.name: RegionAnalyser()
                         for e in (target.expectations if regions else ())})
    data = TextsDigest()  # what every rank must agree on
    keep = keep_examples if keep_example else 0
    options = _Options(timing, timing_repeats, checks_only, keep, streaming,
                       DEFAULT_MAX_MEMORY if max_memory is None else parse_memory(max_memory),
                       first_greedy, first_plain)
    with display(None, enabled=progress, name=f"audit {target.name}"), \
            shard.together("the validity audit"):
        phase("validity")
        seen = 0
        for index, batch in enumerate(_batches(target, limit)):
            data.update(batch.texts)
            if shard.owns(index):
                _audit_batch(target, batch, index, state, options, first=seen)
            # else another rank's batch, audited at the same time
            seen += len(batch)
            advance(len(batch))
    if shard.is_distributed:
        shard.agree("data", data.hexdigest())
        _merge_shards(shard, state)
        _merge_kept(shard, state, keep)
    if state.examples == 0:
        raise TargetError(f"target {target.name!r} yielded no examples to audit")
    metrics = state.analysers.metrics()
    return ValidityAudit(
        target=target.name,
        description=target.description,
        examples=state.examples,
        sites=with_parity(sites_frame(state.sites, state.analysers.site_row_sum_tolerance),
                          state.parity),
        metrics=metrics,
        regions=_regions_frame(state.regions),
        site_summary=summarise_sites(metrics, list(state.sites)),
        performance=pd.DataFrame(state.performance, columns=PERFORMANCE_COLUMNS),
        example=state.example,
        kept_examples=state.kept,
        truncation=target.truncation,
        decoding=describe_decoding(target.decoding),
        degenerate=state.degenerate,
        cached_decoding=(CachedDecoding(False, "the audit ran the gate's checks only")
                         if checks_only else state.cached),
        max_masked_mass=max_masked_mass,
        row_sum_tolerance=row_sum_tolerance,
    )


def _audit_batch(target: Seq2SeqTarget, batch: Batch, index: int, state: _AuditState,
                 options: _Options, *, first: int) -> None:
    """Audit the target's batch number ``index`` into ``state``: greedy decoding, the
    teacher-forced passes, every captured site under its declared rule (call by call as
    capture hands them over when streaming, see :mod:`attnaudit.validity.batch`), the
    performance row and, while fewer than ``options.keep`` are kept, its examples' maps
    (``first``: the position of its first example in the data)."""
    emitted, greedy_times = greedy_timed(target, batch, options.timing, options.least_repeats,
                                         options.first_greedy if index == 0 else None)
    step_mask = target.step_mask(emitted)
    state.degenerate.update(step_mask, target.explain_keys(batch), emitted, target.eos_id)
    kept_rows = max(min(options.keep - len(state.kept), len(batch)), 0)
    analysis = _batch_analysis(target, batch, emitted, step_mask, state, kept_rows)
    with torch.no_grad(), sampled():
        cap, passes = forward_passes(target, batch, emitted, keep=not options.checks_only,
                                     timing=options.timing, plain_first=index % 2 == 0,
                                     on_call=analysis.on_call if options.streaming else None,
                                     max_memory=options.max_memory,
                                     keep_logits=compares_cached(target, options),
                                     least=options.least_repeats,
                                     known_plain=options.first_plain if index == 0 else None)
        if options.streaming and not analysis.verified():  # analyse a kept capture instead
            analysis = _batch_analysis(target, batch, emitted, step_mask, state, kept_rows)
            cap = kept_pass(target, batch, emitted, keep=not options.checks_only,
                            max_memory=options.max_memory)
        merge_parity(state.parity, parity_of(cap))
        if not options.streaming or cap.records:
            analysis.add_records(cap.records)
    for name, facts in analysis.passes.items():
        state.sites.setdefault(name, SiteFacts(facts.site)).update(facts, analysis.roles[name],
                                                                    index)
    for mine, theirs in zip(state.analysers.all, analysis.analysers.all, strict=True):
        mine.merge(theirs)
    state.analysers.merge_tolerances(analysis.analysers.site_row_sum_tolerance)
    for name, regions in analysis.regions.items():
        state.regions[name].merge(regions)
    for row, builder in enumerate(analysis.maps):
        state.kept.append(_kept_example(target, builder, batch, emitted, row, first + row))
        state.example = state.kept[0]
    kept = capture_bytes(cap.records.values()) if cap.records else analysis.largest_call_bytes
    state.performance.append(performance_row(
        index, batch, step_mask, greedy_times, passes, kept,
        sum(f.site.mechanism in MATERIALISED_BY_CAPTURE for f in analysis.passes.values())))
    if compares_cached(target, options):
        state.cached = state.cached.merged(
            compare_cached_decoding(target, batch, emitted, step_mask, first,
                                    max_memory=options.max_memory, forced=passes.logits))
        passes.logits = None
    state.examples += len(batch)


def compares_cached(target: Seq2SeqTarget, options: _Options) -> bool:
    """Whether the audit compares the target's cached decoding with its teacher-forced
    pass: not in a checks-only audit, and only where the target offers one."""
    return not options.checks_only and target.cached_decode is not None


def _batch_analysis(target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor,
                    step_mask: torch.Tensor, state: _AuditState, kept_rows: int
                    ) -> BatchAnalysis:
    """A fresh analysis of one batch, with analysers configured as the audit's and a map
    builder for each of its first ``kept_rows`` examples."""
    mine = state.analysers
    return BatchAnalysis(
        target, batch, emitted, step_mask,
        ValidityAnalysers(mine.max_masked_mass, mine.row_sum_tolerance,
                          checks_only=mine.scores is None),
        {name: RegionAnalyser() for name in state.regions},
        [MapBuilder(batch.source_mask[row].bool(), step_mask[row], example=row)
         for row in range(kept_rows)])


def _merge_shards(shard: Shard, state: _AuditState) -> None:
    """Every rank's validity state merged into ``state``, on every rank: analysers through
    :func:`~attnaudit.analysis.merging.merge_analyser`; sites in the order a single process
    meets them; the performance rows in batch order; degenerate rows and examples summed;
    the cached decoding merged. The kept examples' maps are merged by :func:`_merge_kept`."""
    for analyser in (*state.analysers.all, *state.regions.values()):
        merge_analyser(analyser, shard)
    gathered = shard.all_gather((state.sites, state.analysers.site_row_sum_tolerance,
                                 state.performance, state.degenerate.rows,
                                 state.degenerate.counts, state.cached, state.examples))
    state.sites = merged_site_facts([sites for sites, *_ in gathered])
    total = DegenerateCounter()
    state.cached = reduce(CachedDecoding.merged, [part[5] for part in gathered])
    for _, tolerances, _, rows, counts, _, _ in gathered:
        state.analysers.merge_tolerances(tolerances)
        total.rows += rows
        for reason, n in counts.items():
            total.counts[reason] += n
    state.degenerate = total
    state.performance = sorted((row for _, _, rank_rows, *_ in gathered for row in rank_rows),
                               key=lambda row: row["batch"])
    state.examples = sum(part[-1] for part in gathered)
    parity: dict[str, ParityGap] = {}
    for rank_parity in shard.all_gather(state.parity):
        merge_parity(parity, rank_parity)
    state.parity = parity


def _merge_kept(shard: Shard, state: _AuditState, keep: int) -> None:
    """The first ``keep`` examples' maps over every rank (each rank kept at most ``keep``
    of its own), on every rank."""
    kept = [example for part in shard.all_gather(state.kept) for example in part]
    state.kept = sorted(kept, key=lambda example: example.index)[:keep]
    state.example = state.kept[0] if state.kept else None


def _batches(target: Seq2SeqTarget, limit: int | None) -> Iterator[Batch]:
    """The checked target's batches (:func:`attnaudit.targets.checks.checked_target`)."""
    yield from target.iter_batches(limit)


def _regions_frame(analysers: dict[str, RegionAnalyser]) -> pd.DataFrame:
    frames = [a.compute().assign(expectation=name) for name, a in analysers.items()]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return RegionAnalyser().compute().assign(expectation=pd.Series(dtype=str))
    return pd.concat(frames, ignore_index=True)


def _kept_example(target: Seq2SeqTarget, maps: MapBuilder, batch: Batch,
                  emitted: torch.Tensor, row: int, index: int) -> ExampleMaps:
    """The maps of the batch's example ``row`` (``index`` in the data) at every site,
    labelled with the target's own token names."""
    one = batch.select([row])
    source_tokens = call_target(target.name, "source_tokens", target.source_tokens, one)[0]
    target_tokens = call_target(target.name, "target_tokens", target.target_tokens,
                                emitted[row:row + 1])[0]
    words, rule = source_words(target, one)
    return maps.maps(batch.texts[row], source_tokens, target_tokens, words[0], rule,
                     index=index, family=target.family)
