"""The validity audit: is each attention site a valid weighted retrieval computation?

:func:`run_validity_audit` runs a :class:`~attnaudit.targets.target.Seq2SeqTarget` over its data —
greedy decoding, then the model's own output teacher-forced under capture (docs/metrics.md's
seq2seq protocol) — and streams every record through the entropy, masking, numerics,
score and region analysers. It returns a :class:`ValidityAudit`: tidy
tables plus :meth:`ValidityAudit.findings`, the one source the CI gate
(:mod:`attnaudit.validity.gate`), the pytest helper (:mod:`attnaudit.testing`) and the report read.

Which keys may be attended is *declared* from the target, not read off the model, so a
mask applied after the softmax or masked scores filled with 0 show up as masked mass:

=============  =======================  ==========================  ======================
role           recognised by            eligible keys               rows counted
=============  =======================  ==========================  ======================
cross          (Q, K) = (T, n)          real source tokens          steps up to first EOS
encoder_self   (Q, K) = (n, n)          real source tokens          real source tokens
decoder_self   (Q, K) = (T, T)          causal (key <= query)       steps up to first EOS
captured       any other shape          the key mask capture saw    every row
=============  =======================  ==========================  ======================

n source positions, T emitted steps. When n == T, a square site is cross-attention only
if its kind says so, and encoder or decoder self-attention by its module path (a
decoder-only model's prefix view, whose module also shows a prompt view, is decoder
self-attention); a site neither decides stays "captured". The declared rule is combined
(AND) with the key mask capture saw, so keys a model masks on purpose (local windows...)
stay out of the distribution metrics; weight on them still counts as masked mass.

Rows after the first end-of-sequence step (``target.step_mask``) are padding and are not
counted anywhere. Besides the docs/metrics.md names the metrics table carries, per row:
``masked_rows`` (masked_mass over the masked-mass tolerance), ``row_sum_rows``
(row_sum_error over the row-sum tolerance), ``non_finite_rows`` and ``negative_rows``
(rows with any NaN/inf or negative weight); their ``sum`` is a row count. A "row" is one
(example, head, query step).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd
import torch

from attnaudit.analysis import (
    AttentionRows,
    EntropyAnalyser,
    MaskingAnalyser,
    NumericsAnalyser,
    RegionAnalyser,
    layer_of,
    masking,
    mean_over_heads,
)
from attnaudit.analysis.degenerate import DegenerateCounter
from attnaudit.analysis.example_maps import ExampleMaps, example_maps
from attnaudit.analysis.merging import merge_analyser
from attnaudit.analysis.numerics import row_sum_tolerance
from attnaudit.analysis.scores import ScoreAnalyser
from attnaudit.analysis.words import source_words
from attnaudit.capturing import Capture, capture
from attnaudit.capturing.sites import site_base
from attnaudit.errors import TargetError
from attnaudit.record import AttentionRecord, Site
from attnaudit.runtime.distributed import SINGLE, Shard, TextsDigest
from attnaudit.runtime.measurement import (
    PERFORMANCE_COLUMNS,
    PeakMemory,
    capture_bytes,
    ratio,
    repeat_count,
    spread,
    timed,
)
from attnaudit.runtime.progress import advance, display, phase
from attnaudit.targets.checks import call_target, checked_target
from attnaudit.targets.target import Batch, Seq2SeqTarget
from attnaudit.validity.findings import (
    CAPTURED_RULE,
    Finding,
    describe_tolerance,
    site_findings,
    summarise_sites,
)

DEFAULT_MAX_MASKED_MASS = masking.DEFAULT_TOLERANCE
DEFAULT_ROW_SUM_TOLERANCE = None  # the dtype rule of numerics.row_sum_tolerance


DECLARED_RULES = {
    "cross": "declared: real source tokens",
    "encoder_self": "declared: real source tokens",
    "decoder_self": "declared: causal",
}
# Mechanisms whose score matrix exists only because capture computed it explicitly
# (the model would otherwise run a fused kernel that never materialises it).
MATERIALISED_BY_CAPTURE = ("sdpa", "mha")


@dataclass
class ValidityAudit:
    """What :func:`run_validity_audit` measured. Every table is a tidy DataFrame.

    Attributes:
        target, description: the target's name and description.
        examples: examples audited.
        sites: one row per site: site, kind, role, mechanism, module, layer, heads,
            queries, keys (largest seen), scores_available, values_available,
            key_mask_shape (the key mask as capture derived it; the mask's own dtype is not
            kept by capture), eligibility (the key rules used),
            scores_materialised_by_capture.
        metrics: analyser summaries, one row per site x head x step x metric (columns of
            :meth:`attnaudit.analysis.RowStats.frame`).
        regions: region_mass / top_weight_hit per expectation x site x head x step, cross
            sites only; sites suffixed ``:head_mean`` hold the head average.
        site_summary: one row per site (see :func:`summarise_sites`).
        performance: one row per batch (see :func:`run_validity_audit`).
        example: the first example's attention maps, when kept.
        truncation: how the target truncated its sources ("" when it does not say).
        degenerate: rows per degenerate reason (:mod:`attnaudit.analysis.degenerate`).
        max_masked_mass, row_sum_tolerance: the tolerances rows were counted at; a
            row_sum_tolerance of None means each site's dtype rule (the sites table's
            ``row_sum_tolerance`` column).
    """

    target: str
    description: str
    examples: int
    sites: pd.DataFrame
    metrics: pd.DataFrame
    regions: pd.DataFrame
    site_summary: pd.DataFrame
    performance: pd.DataFrame
    example: ExampleMaps | None
    truncation: str = ""
    degenerate: DegenerateCounter = field(default_factory=DegenerateCounter)
    max_masked_mass: float = DEFAULT_MAX_MASKED_MASS
    row_sum_tolerance: float | None = DEFAULT_ROW_SUM_TOLERANCE

    def findings(self, max_masked_mass: float | None = None,
                 row_sum_tolerance: float | None = None) -> list[Finding]:
        """Every check at every site (see :func:`site_findings`).

        The tolerances default to those the audit counted rows at; other values raise
        ValueError, since failing rows were counted while streaming.
        """
        for name, given, used in (("max_masked_mass", max_masked_mass, self.max_masked_mass),
                                  ("row_sum_tolerance", row_sum_tolerance,
                                   self.row_sum_tolerance)):
            if given is not None and given != used:
                raise ValueError(f"rows were counted at {name}={describe_tolerance(used)}; "
                                 f"run run_validity_audit(..., {name}={given:g}) for another "
                                 "tolerance")
        return site_findings(self.site_summary, self.sites, self.max_masked_mass,
                             dict(zip(self.sites["site"], self.sites["row_sum_tolerance"],
                                      strict=True)))

    @property
    def healthy(self) -> bool:
        """True when no finding fails."""
        return not any(f.status == "fail" for f in self.findings())


class ValidityAnalysers:
    """The analysers every validity check reads, fed together: entropy, masking, numerics
    (with the gate's row counts) and score ranges.

    ``update(record, eligible=..., rows=...)``: ``eligible`` declares the key rule (bool,
    read by rank as in :meth:`attnaudit.analysis.Analyser.update`), combined with the
    record's own key mask (see :func:`declared_rows`); ``rows`` (bool (B, Q), None = all)
    picks the query rows that count.
    """

    def __init__(self, max_masked_mass: float = DEFAULT_MAX_MASKED_MASS,
                 row_sum_tolerance: float | None = DEFAULT_ROW_SUM_TOLERANCE, *,
                 checks_only: bool = False) -> None:
        self.max_masked_mass = max_masked_mass
        self.row_sum_tolerance = row_sum_tolerance
        self.row_analysers = [MaskingAnalyser(max_masked_mass),
                              NumericsAnalyser(row_sum_tolerance)]
        if not checks_only:
            self.row_analysers.insert(0, EntropyAnalyser())
        self.scores = None if checks_only else ScoreAnalyser()
        # site -> the largest row-sum tolerance its rows were counted at
        self.site_row_sum_tolerance: dict[str, float] = {}

    def update(self, record: AttentionRecord, *, eligible: torch.Tensor | None = None,
               rows: torch.Tensor | None = None) -> None:
        data = declared_rows(record, eligible)
        used = (row_sum_tolerance(data.dtype, data.weights.shape[-1])
                if self.row_sum_tolerance is None else self.row_sum_tolerance)
        known = self.site_row_sum_tolerance.get(data.site, used)
        self.site_row_sum_tolerance[data.site] = max(known, used)
        scores = record.scores
        # a stacked record keeps only its last call's values: usable when there is one call
        values = record.values if len(record.calls) == 1 else None
        batch, _, queries, _ = data.weights.shape
        for examples, start, stop in row_groups(data.site, rows, batch, queries):
            part = replace(data, weights=data.weights[examples, :, start:stop],
                           eligible=data.eligible[examples, :, start:stop],
                           step_offset=data.step_offset + start)
            for analyser in self.row_analysers:
                analyser.update(part)
            if self.scores is None:
                continue
            self.scores.update(
                part, scores=None if scores is None else scores[examples, :, start:stop],
                values=None if values is None else values[examples % values.shape[0]])

    def metrics(self) -> pd.DataFrame:
        frames = [a.compute() for a in (*self.row_analysers, self.scores) if a is not None]
        frames = [f for f in frames if not f.empty]
        if not frames:
            return self.row_analysers[0].compute()
        return pd.concat(frames, ignore_index=True)


def row_groups(site: str, selected: torch.Tensor | None, batch: int, queries: int
               ) -> Iterator[tuple[torch.Tensor, int, int]]:
    """The selected query rows (bool (B, Q); None = all) as (examples, start, stop) groups.

    Examples sharing a selection pattern go together, one group per run of consecutive
    selected steps ``start:stop``; prefix masks (the usual case: steps up to EOS,
    right-padded sources) give one group per distinct length.
    """
    if selected is None:
        yield torch.arange(batch), 0, queries
        return
    if tuple(selected.shape) != (batch, queries):
        raise ValueError(f"site {site!r}: row selection of shape {tuple(selected.shape)} "
                         f"does not match (batch, queries) = ({batch}, {queries})")
    if not selected.any():  # also an output with no step: (B, 0)
        return
    patterns, which = torch.unique(selected.cpu(), dim=0, return_inverse=True)
    for p, pattern in enumerate(patterns):
        examples = torch.nonzero(which == p).squeeze(1)
        for start, stop in _runs(torch.nonzero(pattern).squeeze(1).tolist()):
            yield examples, start, stop


def _runs(steps: list[int]) -> Iterator[tuple[int, int]]:
    """Sorted indices -> (start, stop) of each run of consecutive ones."""
    start = prev = None
    for s in steps:
        if start is None:
            start = s
        elif s != prev + 1:
            yield start, prev + 1
            start = s
        prev = s
    if start is not None:
        yield start, prev + 1


def site_role(name: str, kind: str | None, queries: int, keys: int, n_source: int,
              n_target: int, prefix_view: bool = False) -> str:
    """cross, encoder_self, decoder_self or captured (no declared rule fits); see module doc.

    prefix_view: the site is a decoder-only model's prefix view (its module also shows a
    prompt view, :mod:`attnaudit.capturing.views`): its queries are steps."""
    if (queries, keys) == (n_target, n_source) and (kind == "cross" or n_target != n_source):
        return "cross"
    if kind == "cross":
        return "captured"
    encoder = (queries, keys) == (n_source, n_source)
    decoder = (queries, keys) == (n_target, n_target)
    if encoder and decoder and prefix_view:
        return "decoder_self"
    if encoder and decoder:
        module = name.split(":", 1)[0].lower()
        encoder, decoder = "encoder" in module, "decoder" in module
        if encoder == decoder:
            return "captured"
    if encoder:
        return "encoder_self"
    if decoder:
        return "decoder_self"
    return "captured"


def declared_rule(role: str, batch: Batch, step_mask: torch.Tensor
                  ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(eligible keys, bool (B, 1, Q or 1, K) or None; rows that count, bool (B, Q) or None)."""
    source = batch.source_mask.bool()
    if role == "cross":
        return source[:, None, None, :], step_mask
    if role == "encoder_self":
        return source[:, None, None, :], source
    if role == "decoder_self":
        steps = step_mask.shape[1]
        causal = torch.ones(steps, steps, dtype=torch.bool, device=step_mask.device).tril()
        return causal[None, None], step_mask
    return None, None


def declared_rows(record: AttentionRecord, declared: torch.Tensor | None) -> AttentionRows:
    """The record's rows under the declared key rule AND the key mask capture saw.

    ``declared``: bool, read by rank ((K,), (B, K), (B, Q, K), (B, H, Q, K)); None keeps
    the captured mask alone (all keys when capture has none either).
    """
    data = AttentionRows.of(record, declared)
    captured = record.key_mask
    if declared is None or captured is None:
        return data
    return replace(data, eligible=data.eligible & captured.to(data.eligible.device))


@dataclass
class _SiteInfo:
    """What the sites table says about one site, gathered over batches."""

    record_site: Site
    heads: int = 0
    queries: int = 0
    keys: int = 0
    scores_available: bool = True
    values_available: bool = True
    key_mask_shape: str = ""
    weights_dtype: str = ""
    rules: set[str] = field(default_factory=set)
    roles: set[str] = field(default_factory=set)
    first_batch: int = -1
    last_batch: int = -1

    def update(self, record: AttentionRecord, role: str, batch: int) -> None:
        if self.first_batch < 0:
            self.first_batch = batch
        self.last_batch = batch
        _, h, q, k = record.weights.shape
        self.heads, self.queries, self.keys = h, max(self.queries, q), max(self.keys, k)
        self.scores_available &= record.scores is not None
        self.values_available &= record.values is not None
        mask = record.key_mask
        self.key_mask_shape = "none" if mask is None else str(tuple(mask.shape))
        self.weights_dtype = str(record.weights.dtype).removeprefix("torch.")
        self.roles.add(role)
        self.rules.add(DECLARED_RULES.get(role, CAPTURED_RULE))

    def merge(self, other: _SiteInfo) -> None:
        """Fold in what another shard saw of the same site (its batches' facts); the
        facts kept from the last batch come from whichever saw the later batch."""
        later = other.last_batch > self.last_batch
        if later:
            self.heads, self.key_mask_shape = other.heads, other.key_mask_shape
            self.weights_dtype, self.last_batch = other.weights_dtype, other.last_batch
        self.queries, self.keys = max(self.queries, other.queries), max(self.keys, other.keys)
        self.scores_available &= other.scores_available
        self.values_available &= other.values_available
        self.roles |= other.roles
        self.rules |= other.rules
        self.first_batch = min(self.first_batch, other.first_batch)

    def row(self, row_sum_tolerance: float) -> dict[str, Any]:
        site = self.record_site
        return {
            "site": site.name, "kind": site.kind, "role": "/".join(sorted(self.roles)),
            "mechanism": site.mechanism, "module": site.module, "layer": layer_of(site.name),
            "layout": site.layout, "layout_source": site.layout_source,
            "heads": self.heads, "queries": self.queries, "keys": self.keys,
            "scores_available": self.scores_available,
            "values_available": self.values_available,
            "key_mask_shape": self.key_mask_shape,
            "weights_dtype": self.weights_dtype,
            "row_sum_tolerance": row_sum_tolerance,
            "eligibility": "; ".join(sorted(self.rules)),
            "scores_materialised_by_capture": site.mechanism in MATERIALISED_BY_CAPTURE,
        }


SITE_COLUMNS = ["site", "kind", "role", "mechanism", "module", "layer", "layout", "layout_source",
                "heads", "queries", "keys", "scores_available", "values_available",
                "key_mask_shape", "weights_dtype", "row_sum_tolerance", "eligibility",
                "scores_materialised_by_capture"]



def run_validity_audit(target: Seq2SeqTarget, *, limit: int | None = None,
                       progress: bool = True, keep_example: bool = True,
                       regions: bool = True, timing: bool = True,
                       max_masked_mass: float = DEFAULT_MAX_MASKED_MASS,
                       row_sum_tolerance: float | None = DEFAULT_ROW_SUM_TOLERANCE,
                       checks_only: bool = False, shard: Shard = SINGLE) -> ValidityAudit:
    """Audit every attention site of ``target`` over its data (see the module docstring).

    Args:
        target: the model and its data; the model is left unchanged.
        limit: audit only the first ``limit`` examples (>= 1).
        progress: a progress display on stderr (:mod:`attnaudit.runtime.progress`).
        keep_example: keep the first example's attention maps.
        regions: measure the target's expectations (region_mass, top_weight_hit).
        timing: time greedy decoding and the forward without and with capture, repeated
            (see below), and measure peak memory; without it no time is reported.
        max_masked_mass, row_sum_tolerance: the tolerances failing rows are counted at;
            row_sum_tolerance None: per site from the weights' dtype and key count
            (:func:`attnaudit.analysis.numerics.row_sum_tolerance`).
        checks_only: only what the gate judges: capture without scores and values, the
            masking and numerics analysers only (no entropy, no score ranges), so the
            audit costs little more than the greedy decode and one teacher-forced pass.
        shard: this process's part of a distributed audit (:mod:`attnaudit.runtime.distributed`):
            it audits its own batches, and every rank returns the merged audit (the first
            example's maps, from batch 0, on rank 0 only).

    The performance table has one row per batch: examples; real source tokens and
    emitted steps up to EOS; with ``timing``, greedy decoding (``greedy_repeats`` times)
    and the teacher-forced forward without and with capture (``repeats`` times each,
    alternating which runs first) are timed repeatedly
    (:func:`~attnaudit.runtime.measurement.repeat_count`), and each time is the median
    with its smallest and largest value (``*_s``, ``*_s_min``, ``*_s_max``);
    capture_overhead = captured / plain per repeat, its median and range; valid tokens
    (source + target) per second from the medians; peak memory above the level before
    the first pass in MiB, measured for CUDA models from the allocator and NaN (not
    measured) elsewhere; capture_mib, the exact size of the tensors capture kept; sites
    whose score matrix capture materialised. Without ``timing`` every time is NaN.

    Raises:
        TargetError: the target's callables fail or return the wrong shapes, or there is
            no data. Capture errors (no attention found...) propagate.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                              or limit < 1):
        raise ValueError(f"limit must be a positive number of examples, got {limit!r}")
    target = checked_target(target)
    analysers = ValidityAnalysers(max_masked_mass, row_sum_tolerance, checks_only=checks_only)
    expectation_analysers = {e.name: RegionAnalyser()
                             for e in (target.expectations if regions else ())}
    infos: dict[str, _SiteInfo] = {}
    performance: list[dict[str, Any]] = []
    degenerate = DegenerateCounter()
    example: ExampleMaps | None = None
    examples = 0
    data = TextsDigest()  # what every rank must agree on
    with display(None, enabled=progress, name=f"audit {target.name}"), \
            shard.together("the validity audit"):
        phase("validity")
        for index, batch in enumerate(_batches(target, limit)):
            data.update(batch.texts)
            if not shard.owns(index):
                advance(len(batch))  # another rank's batch, audited at the same time
                continue
            emitted, greedy_s = timed(lambda b=batch: _greedy(target, b))
            greedy_times = [greedy_s, *(timed(lambda b=batch: _greedy(target, b))[1]
                                        for _ in range(repeat_count(greedy_s) - 1))
                            ] if timing else []
            step_mask = target.step_mask(emitted)
            degenerate.update(step_mask, target.explain_keys(batch), emitted, target.eos_id)
            with torch.no_grad():
                cap, passes = _forward_passes(target, batch, emitted, keep=not checks_only,
                                              timing=timing, plain_first=index % 2 == 0)
            n_source, n_target = batch.source_ids.shape[1], emitted.shape[1]
            roles = {}
            prompt_views = {site_base(n) for n, r in cap.records.items() if r.kind == "cross"}
            for name, record in cap.records.items():
                _, _, q, k = record.weights.shape
                role = roles[name] = site_role(name, record.kind, q, k, n_source, n_target,
                                               record.kind == "self"
                                               and site_base(name) in prompt_views)
                declared, rows = declared_rule(role, batch, step_mask)
                infos.setdefault(name, _SiteInfo(record.site)).update(record, role, index)
                analysers.update(record, eligible=declared, rows=rows)
                if role == "cross" and expectation_analysers:
                    _update_regions(target, expectation_analysers, declared_rows(record, declared),
                                    batch, emitted, step_mask)
            if keep_example and example is None:
                example = _first_example(target, cap.records, roles, batch, emitted, step_mask)
            source_tokens, target_tokens = int(batch.source_mask.sum()), int(step_mask.sum())
            times = {**spread("greedy_s", greedy_times), **spread("plain_s", passes.plain),
                     **spread("captured_s", passes.captured),
                     **spread("capture_overhead", passes.overheads())}
            performance.append({
                "batch": index, "examples": len(batch), "source_tokens": source_tokens,
                "target_tokens": target_tokens, "greedy_repeats": len(greedy_times),
                "repeats": len(passes.plain), **times,
                "tokens_per_s_plain": ratio(source_tokens + target_tokens, times["plain_s"]),
                "tokens_per_s_captured": ratio(source_tokens + target_tokens,
                                               times["captured_s"]),
                "plain_peak_mib": passes.plain_peak_mib,
                "captured_peak_mib": passes.captured_peak_mib,
                "capture_mib": capture_bytes(cap.records.values()) / 2**20,
                "materialised_sites": sum(r.site.mechanism in MATERIALISED_BY_CAPTURE
                                          for r in cap.records.values()),
            })
            examples += len(batch)
            advance(len(batch))
    if shard.is_distributed:
        shard.agree("data", data.hexdigest())
        infos, performance, degenerate, examples = _merged_shards(
            shard, analysers, expectation_analysers, infos, performance, degenerate, examples)
    if examples == 0:
        raise TargetError(f"target {target.name!r} yielded no examples to audit")
    metrics = analysers.metrics()
    tolerances = analysers.site_row_sum_tolerance
    sites = pd.DataFrame([info.row(tolerances[name]) for name, info in infos.items()],
                         columns=SITE_COLUMNS)
    sites["layer"] = sites["layer"].astype("Int64")
    return ValidityAudit(
        target=target.name,
        description=target.description,
        examples=examples,
        sites=sites,
        metrics=metrics,
        regions=_regions_frame(expectation_analysers),
        site_summary=summarise_sites(metrics, list(infos)),
        performance=pd.DataFrame(performance, columns=PERFORMANCE_COLUMNS),
        example=example,
        truncation=target.truncation,
        degenerate=degenerate,
        max_masked_mass=max_masked_mass,
        row_sum_tolerance=row_sum_tolerance,
    )


def _merged_shards(shard: Shard, analysers: ValidityAnalysers,
                   expectation_analysers: dict[str, RegionAnalyser],
                   infos: dict[str, _SiteInfo], performance: list[dict[str, Any]],
                   degenerate: DegenerateCounter, examples: int
                   ) -> tuple[dict[str, _SiteInfo], list[dict[str, Any]], DegenerateCounter, int]:
    """Every rank's validity state merged, on every rank: analysers through
    :func:`~attnaudit.analysis.merging.merge_analyser`; sites in the order a single process
    meets them; the performance rows in batch order; degenerate rows and examples summed."""
    for analyser in (*analysers.row_analysers, analysers.scores,
                     *expectation_analysers.values()):
        if analyser is not None:
            merge_analyser(analyser, shard)
    gathered = shard.all_gather((infos, analysers.site_row_sum_tolerance, performance,
                                 degenerate.rows, degenerate.counts, examples))
    merged: dict[str, _SiteInfo] = {}
    seen = [(info.first_batch, at, name, info) for rank_infos, *_ in gathered
            for at, (name, info) in enumerate(rank_infos.items())]
    for _, _, name, info in sorted(seen, key=lambda item: item[:2]):
        if name in merged:
            merged[name].merge(info)
        else:
            merged[name] = info
    tolerances = analysers.site_row_sum_tolerance
    total = DegenerateCounter()
    for _, rank_tolerances, _, rows, counts, _ in gathered:
        for name, used in rank_tolerances.items():
            tolerances[name] = max(tolerances.get(name, used), used)
        total.rows += rows
        for reason, n in counts.items():
            total.counts[reason] += n
    rows = sorted((row for _, _, rank_rows, *_ in gathered for row in rank_rows),
                  key=lambda row: row["batch"])
    return merged, rows, total, sum(part[-1] for part in gathered)


def _batches(target: Seq2SeqTarget, limit: int | None) -> Iterator[Batch]:
    """The checked target's batches (:func:`attnaudit.targets.checks.checked_target`)."""
    yield from target.iter_batches(limit)


def _greedy(target: Seq2SeqTarget, batch: Batch) -> torch.Tensor:
    with torch.no_grad():
        return target.greedy(batch)


def _teacher_forced(target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor) -> None:
    target.teacher_forced(batch, emitted)


@dataclass
class _Passes:
    """Seconds of each timed teacher-forced pass without and with capture (paired by
    repeat) and the peak memory of the first of each (NaN: not measured)."""

    plain: list[float] = field(default_factory=list)
    captured: list[float] = field(default_factory=list)
    plain_peak_mib: float = math.nan
    captured_peak_mib: float = math.nan

    def overheads(self) -> list[float]:
        """captured / plain per repeat."""
        return [ratio(c, p) for c, p in zip(self.captured, self.plain, strict=True)]


def _forward_passes(target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor, *,
                    keep: bool, timing: bool, plain_first: bool) -> tuple[Capture, _Passes]:
    """The teacher-forced pass under capture whose records are analysed (``keep``: scores
    and values too) and, with ``timing``, timed passes without and with capture, as many
    of each as :func:`~attnaudit.runtime.measurement.repeat_count` asks for the first
    one, alternating which runs first so that warm-up favours neither; the analysed pass
    is the first timed one with capture."""
    passes = _Passes()
    kept: Capture | None = None
    repeats = 1
    repeat = 0
    while repeat < repeats:
        for captured in ((False, True) if plain_first != (repeat % 2 == 1) else (True, False)):
            if captured:
                with PeakMemory(target.model) as memory:
                    start = time.perf_counter()
                    with capture(target.model, target.sites, kinds=target.kinds,
                                 scores=keep, values=keep) as cap:
                        _teacher_forced(target, batch, emitted)
                    passes.captured.append(time.perf_counter() - start)
                if kept is None:
                    kept, passes.captured_peak_mib = cap, memory.peak_mib
            elif timing:
                with PeakMemory(target.model) as memory:
                    _, seconds = timed(lambda: _teacher_forced(target, batch, emitted))
                passes.plain.append(seconds)
                if len(passes.plain) == 1:
                    passes.plain_peak_mib = memory.peak_mib
        if timing and repeat == 0:
            repeats = repeat_count(max(passes.plain[0], passes.captured[0]))
        repeat += 1
    if not timing:
        passes.captured.clear()  # one untimed pass: no timing is reported from it
    assert kept is not None
    return kept, passes


def _update_regions(target: Seq2SeqTarget, analysers: dict[str, RegionAnalyser],
                    data: AttentionRows,
                    batch: Batch, emitted: torch.Tensor, step_mask: torch.Tensor) -> None:
    """Feed each expectation's region analyser the rows per head and averaged over heads."""
    for expectation in target.expectations:
        if expectation.name not in analysers:
            continue
        expected = call_target(target.name, f"expectation {expectation.name!r}",
                               expectation.keys, batch, emitted)
        rows = step_mask.clone()
        if expectation.rows is not None:
            rows[:, expectation.rows:] = False
        analyser = analysers[expectation.name]
        analyser.update(data, expected=expected, rows=rows)
        analyser.update(mean_over_heads(data), expected=expected, rows=rows)


def _regions_frame(analysers: dict[str, RegionAnalyser]) -> pd.DataFrame:
    frames = [a.compute().assign(expectation=name) for name, a in analysers.items()]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return RegionAnalyser().compute().assign(expectation=pd.Series(dtype=str))
    return pd.concat(frames, ignore_index=True)


def _first_example(target: Seq2SeqTarget, records: dict[str, AttentionRecord],
                   roles: dict[str, str], batch: Batch, emitted: torch.Tensor,
                   step_mask: torch.Tensor) -> ExampleMaps:
    """Example 0's maps at every site, labelled with the target's own token names."""
    source_tokens = call_target(target.name, "source_tokens", target.source_tokens,
                                batch.select([0]))[0]
    target_tokens = call_target(target.name, "target_tokens", target.target_tokens,
                                emitted[:1])[0]
    words, rule = source_words(target, batch.select([0]))
    return example_maps(records, roles, batch.texts[0], source_tokens, target_tokens,
                        batch.source_mask[0], step_mask[0], words[0], rule)
