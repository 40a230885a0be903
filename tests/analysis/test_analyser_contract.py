"""One harness for every streaming analyser: streaming, sharding, invariances, bad input.

Every analyser in ``CASES`` is checked against the independent numpy reference in
``references.py`` (written from docs/metrics.md, no attnaudit code), on random attention batches:

* one-shot update == update over batch slices == merge of per-slice shards (in any order,
  into a fresh analyser or into a shard) == update over a permuted batch == reference.
  ``n`` exactly; ``mean``/``sum``/``min``/``max`` to rtol 1e-9 (atol 1e-12, for values such
  as kl_to_uniform that cancel to ~0); quantiles inside [min, max] and within one histogram
  bin of the exact (inverted-CDF) quantile, or in the edge bin when the exact value lies
  outside the metric's histogram range. Between analysers fed the same rows in a different
  grouping, quantiles agree to 1e-12 (same histogram).
* the three ways rows arrive agree: ``AttentionRows`` directly, an ``AttentionRecord`` whose calls
  split the query axis and carry the key mask, and a record with no mask plus a declared
  ``update(record, eligible=...)``.
* appending padded keys (ineligible, weight 0, score -inf, value 0) to every row changes
  nothing, to 1e-12, except two metrics whose definitions count the padded keys themselves:
  ``all_masked_uniform`` (uniform means 1/K, and K grew) and ``masked_score_non_finite``
  (each padded key is one more -inf fill). For those two the padded result must still equal
  the reference on the padded input. Every other metric is unchanged: entropy family and
  max_weight (only eligible keys), n_valid, masked_mass (the added mass is 0), masked_rows,
  non_finite / negative (0 is neither), row_sum_error (adds 0), all_masked, all_masked_nan /
  all_masked_zeros (0 keeps a row finite and zero), softmax_axis_suspect (a column no query
  may attend is not judged), the score ranges (-inf is no finite score) and output_norm
  (weight 0).
* a batch with a different number of queries and keys, fed after the first, grows the step
  axis and still equals the reference over both.
* generated batches mix float32 / float16 / bfloat16 weights (the reference sees the same
  values upcast), with pre-softmax scores (masked keys filled with -inf, -1e9, the dtype's
  min or 0) and values, either or both or neither (the score metrics are then absent),
  per-row or key-padding masks, leaky rows (softmax over all keys), rows
  masked after the softmax without renormalising, all-masked rows (NaN, zeros, uniform or
  leftover softmax), rows with NaN / +-inf, and heads softmaxed over the query axis. Every
  ``compute()`` frame is checked to have no NaN in a numeric column.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import attnaudit
from attnaudit.analysis import (
    Analyser,
    AttentionRows,
    EntropyAnalyser,
    MaskingAnalyser,
    NumericsAnalyser,
    ScoreAnalyser,
)
from attnaudit.analysis.stats import HIST_BINS
from attnaudit.record import AttentionCall, AttentionRecord, Site
from tests.helpers.metric_references import (
    ENTROPY_METRICS,
    MASK_TOLERANCE,
    MASKING_METRICS,
    NUMERICS_METRICS,
    OUTPUT_METRICS,
    SCORE_METRICS,
    PerRow,
    aggregate,
    per_row,
    per_row_scores,
)

SITE = "model.decoder.layers.1.attn:self"
KIND = "self"
LAYER = 1
KEYS = ["site", "head", "step", "metric"]
STATS = ["mean", "sum", "min", "max"]
QCOLS = ["q10", "q50", "q90"]
NUMERIC = ["n", *STATS, *QCOLS]
RTOL, ATOL = 1e-9, 1e-12
# Metrics whose definition counts every key, so right-padding keys may change them.
KEY_COUNT_METRICS = frozenset({"all_masked_uniform", "masked_score_non_finite"})
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FAST = settings(max_examples=35, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@dataclass(frozen=True)
class Case:
    """An analyser under test: how to build it, the metrics it owns, its reference knobs."""

    id: str
    make: Callable[..., Analyser]  # keyword arguments go to the analyser (per_example=...)
    metrics: tuple[str, ...]
    tolerance: float = MASK_TOLERANCE  # masked_rows threshold the reference uses

    def reference(self, batches: Sequence[Batch], site: str = SITE) -> pd.DataFrame:
        return aggregate(site, [b.reference(self.tolerance) for b in batches], self.metrics)


# Add new analysers here (and their per-row reference to references.py).
CASES = [
    Case("entropy", EntropyAnalyser, ENTROPY_METRICS),
    Case("masking", MaskingAnalyser, MASKING_METRICS),
    Case("masking-tol-0.01", lambda **kw: MaskingAnalyser(tolerance=1e-2, **kw),
         MASKING_METRICS, 1e-2),
    Case("numerics", NumericsAnalyser, NUMERICS_METRICS),
    Case("scores", ScoreAnalyser, SCORE_METRICS + OUTPUT_METRICS),
]
ENTROPY, MASKING, NUMERICS, SCORES = (next(c for c in CASES if c.id == name)
                                      for name in ("entropy", "masking", "numerics", "scores"))
by_case = pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])


# --------------------------------------------------------------------------- batches


@dataclass
class Batch:
    """weights (B, H, Q, K) in the model dtype; eligible bool, (B, H, Q, K) or (B, 1, 1, K);
    pre-softmax scores (B, H, Q, K) and values (B, H, K, d_v) when the model exposes them."""

    weights: torch.Tensor
    eligible: torch.Tensor
    scores: torch.Tensor | None = None
    values: torch.Tensor | None = None

    def reference(self, tolerance: float = MASK_TOLERANCE) -> PerRow:
        w, e = self.weights.to(torch.float64).numpy(), self.eligible.numpy()
        return per_row(w, e, tolerance) | per_row_scores(
            w, e, *(None if t is None else t.to(torch.float64).numpy()
                    for t in (self.scores, self.values)))

    def take(self, index: Sequence[int] | slice) -> Batch:
        if not isinstance(index, slice):
            index = torch.as_tensor(list(index), dtype=torch.long)
        return Batch(*(None if t is None else t[index]
                       for t in (self.weights, self.eligible, self.scores, self.values)))

    def padded(self, extra: int) -> Batch:
        """``extra`` more keys on every row: ineligible, weight 0, score -inf, value 0."""
        def pad(t: torch.Tensor | None, fill: float | bool, axis: int = -1):
            if t is None:
                return None
            shape = list(t.shape)
            shape[axis] = extra
            return torch.cat([t, torch.full(shape, fill, dtype=t.dtype)], axis)

        return Batch(pad(self.weights, 0.0), pad(self.eligible, False),
                     pad(self.scores, float("-inf")), pad(self.values, 0.0, axis=2))


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@dataclass(frozen=True)
class Spec:
    """What to generate; the numbers come from a numpy generator seeded with ``seed``."""

    batch: int
    heads: int
    queries: int
    keys: int
    dtype: torch.dtype
    layout: str  # "rows": a mask per row; "keys": key padding (B, 1, 1, K)
    leaky: bool
    unnormalised: bool
    all_masked: bool
    bad: bool
    wrong_axis: bool
    scale: float
    seed: int
    inputs: str = "both"  # which of scores / values the record carries: both, scores, values, none
    fill: float = float("-inf")  # the masked-score fill


def make_batch(s: Spec) -> Batch:
    rng = np.random.default_rng(s.seed)
    b, h, q, k = s.batch, s.heads, s.queries, s.keys
    suspect = (rng.random((b, h)) < 0.6) if s.wrong_axis and q > 1 else np.zeros((b, h), bool)
    if s.layout == "rows":
        elig = rng.random((b, h, q, k)) < rng.uniform(0.4, 1.0)
        if s.all_masked:
            elig[rng.random((b, h, q)) < 0.25] = False
    else:
        elig = (np.arange(k)[None, :] < rng.integers(1, k + 1, size=b)[:, None])
        if s.all_masked:
            elig[rng.random(b) < 0.3] = False
        elig = elig[:, None, None, :]
    full = np.broadcast_to(elig, (b, h, q, k))
    scores = rng.normal(0.0, s.scale, (b, h, q, k))
    soft_all = _softmax(scores, -1)
    e = np.exp(scores - scores.max(-1, keepdims=True)) * full
    total = e.sum(-1, keepdims=True)
    w = np.where(total > 0, e / np.where(total > 0, total, 1.0), 0.0)
    if s.leaky:
        rows = rng.random((b, h, q)) < 0.4
        w[rows] = soft_all[rows]
    if s.unnormalised:
        rows = rng.random((b, h, q)) < 0.4
        w[rows] = (soft_all * full)[rows]
    dead = ~full.any(-1)
    produced = rng.integers(0, 4, size=(b, h, q))
    w[dead & (produced == 0)] = np.nan
    w[dead & (produced == 1)] = 0.0
    w[dead & (produced == 2)] = 1.0 / k
    w[dead & (produced == 3)] = soft_all[dead & (produced == 3)]
    if suspect.any():
        w[suspect] = _softmax(scores, -2)[suspect]
    if s.bad:
        rows = rng.random((b, h, q)) < (0.3 - 0.2 * suspect[..., None])
        for i, j, t in zip(*np.nonzero(rows), strict=True):
            if rng.random() < 0.3:
                w[i, j, t] = np.nan
            else:
                w[i, j, t, rng.integers(0, k)] = rng.choice([np.nan, np.inf, -np.inf])
    weights = torch.from_numpy(w).to(s.dtype)
    masked_scores = np.where(full, scores, s.fill)
    if s.bad:
        masked_scores[rng.random((b, h, q, k)) < 0.05] = np.nan
    values = rng.normal(0.0, 2.0, (b, h, k, int(rng.integers(1, 5))))
    if s.bad and values.size:
        values.flat[int(rng.integers(0, values.size))] = np.inf
    return Batch(weights, torch.from_numpy(np.ascontiguousarray(elig)),
                 torch.from_numpy(masked_scores).to(s.dtype) if s.inputs in ("both", "scores")
                 else None,
                 torch.from_numpy(values).to(s.dtype) if s.inputs in ("both", "values")
                 else None)


@st.composite
def specs(draw, heads: int | None = None) -> Spec:
    return Spec(
        batch=draw(st.integers(0, 5)),
        heads=heads if heads is not None else draw(st.integers(1, 3)),
        queries=draw(st.integers(1, 6)),
        keys=draw(st.integers(1, 8)),
        dtype=draw(st.sampled_from(DTYPES)),
        layout=draw(st.sampled_from(["rows", "keys"])),
        leaky=draw(st.booleans()),
        unnormalised=draw(st.booleans()),
        all_masked=draw(st.booleans()),
        bad=draw(st.booleans()),
        wrong_axis=draw(st.booleans()),
        scale=draw(st.sampled_from([0.5, 3.0, 12.0])),
        seed=draw(st.integers(0, 2**32 - 1)),
        inputs=draw(st.sampled_from(["both", "both", "scores", "values", "none"])),
        fill=draw(st.sampled_from([float("-inf"), -1e9, float(torch.finfo(torch.float32).min),
                                   0.0])),
    )


# --------------------------------------------------------------------------- feeding


def record_of(batch: Batch, cuts: Sequence[int] = (), *, with_mask: bool = True,
              site: str = SITE) -> AttentionRecord:
    """A record whose calls split the query axis at ``cuts`` (a decoder step loop)."""
    rec = AttentionRecord(Site(site, KIND, "tap", site.split(":")[0]))
    q = batch.weights.shape[2]
    bounds = [0, *sorted(c for c in set(cuts) if 0 < c < q), q]
    for lo, hi in itertools.pairwise(bounds):
        mask = batch.eligible
        if len(bounds) > 2 and mask.shape[2] > 1:
            mask = mask[:, :, lo:hi]
        source = (lambda m=mask: m) if with_mask else None
        scores = None if batch.scores is None else batch.scores[:, :, lo:hi]
        rec.append(AttentionCall(weights=batch.weights[:, :, lo:hi], mask_source=source,
                                 scores=scores, values=batch.values))
    return rec


def feed(analyser: Analyser, batch: Batch, path: str = "rows", cuts: Sequence[int] = (),
         site: str = SITE) -> None:
    """Update ``analyser`` with ``batch`` along one of the three input paths."""
    if path == "rows":
        w = batch.weights.to(torch.float64)
        rows = AttentionRows(site, KIND, w, batch.eligible.expand(w.shape))
        if isinstance(analyser, ScoreAnalyser):  # AttentionRows carry no scores or values
            analyser.update(rows, scores=batch.scores, values=batch.values)
        else:
            analyser.update(rows)
    elif path == "record":
        analyser.update(record_of(batch, cuts, site=site))
    elif path == "declared":
        analyser.update(record_of(batch, cuts, with_mask=False, site=site),
                        eligible=batch.eligible)
    else:
        raise AssertionError(path)


def fed(case: Case, batches: Sequence[Batch], path: str = "rows",
        cuts: Sequence[int] = ()) -> Analyser:
    analyser = case.make()
    for b in batches:
        feed(analyser, b, path, cuts)
    return analyser


# --------------------------------------------------------------------------- assertions


@dataclass
class Table:
    """A compute()-style frame as sorted cell keys and a float array of NUMERIC columns
    (plain Python and numpy: much faster than pandas indexing for hundreds of comparisons)."""

    keys: list[tuple]
    values: np.ndarray

    @classmethod
    def of(cls, frame: pd.DataFrame, drop: frozenset[str] = frozenset()) -> Table:
        keys = list(zip(*(frame[c].tolist() for c in KEYS), strict=True))
        values = frame[NUMERIC].to_numpy(dtype=float).reshape(len(frame), len(NUMERIC))
        order = [i for i in sorted(range(len(keys)), key=keys.__getitem__)
                 if keys[i][3] not in drop]
        return cls([keys[i] for i in order], values[order])

    def col(self, name: str) -> np.ndarray:
        return self.values[:, NUMERIC.index(name)]


def assert_no_nan(frame: pd.DataFrame) -> None:
    bad = np.isnan(frame[NUMERIC].to_numpy(dtype=float)).any(axis=1)
    assert not bad.any(), f"NaN in summary columns:\n{frame[bad]}"


def _same_cells(got: Table, exp: Table) -> None:
    if got.keys != exp.keys:
        missing = sorted(set(exp.keys) - set(got.keys))
        extra = sorted(set(got.keys) - set(exp.keys))
        raise AssertionError(f"cells missing {missing[:5]}, unexpected {extra[:5]}")


def _close(got: Table, exp: Table, columns: Sequence[str], rtol: float, atol: float) -> None:
    for c in columns:
        a, b = got.col(c), exp.col(c)
        ok = np.isclose(a, b, rtol=rtol, atol=atol) | (a == b)
        if not ok.all():
            bad = [(k, x, y) for k, x, y, good in zip(got.keys, a, b, ok, strict=True)
                   if not good]
            raise AssertionError(f"column {c!r} differs (cell, got, expected): {bad[:10]}")


def assert_matches_reference(frame: pd.DataFrame, ref: pd.DataFrame, analyser: Analyser, *,
                             kind: str | None = KIND, layer: int | None = LAYER) -> None:
    """``frame`` (from compute()) against the exact reference summaries."""
    assert_no_nan(frame)
    assert list(frame.columns) == ["site", "kind", "layer", "head", "step", "metric", *NUMERIC]
    if len(frame):
        assert (frame["kind"] == kind).all() if kind else frame["kind"].isna().all()
        assert (frame["layer"] == layer).all() if layer is not None else frame["layer"].isna().all()
    got, exp = Table.of(frame), Table.of(ref)
    _same_cells(got, exp)
    np.testing.assert_array_equal(got.col("n"), exp.col("n"))
    _close(got, exp, STATS, RTOL, ATOL)
    ranges = {s.name: (s.lo, s.hi) for s in type(analyser).metrics}
    lows, highs = got.col("min"), got.col("max")
    for qc in QCOLS:
        for key, value, exact, low, high in zip(got.keys, got.col(qc), exp.col(qc), lows, highs,
                                                strict=True):
            lo, hi = ranges[key[3]]
            width = (hi - lo) / HIST_BINS
            slack = width * 1e-9 + ATOL
            where = f"{key} {qc}={value} exact={exact}"
            assert low - ATOL <= value <= high + ATOL, f"outside [min, max]: {where}"
            if exact > hi:  # beyond the histogram range: the top bin
                assert value >= hi - width - slack, f"not in the top bin: {where}"
            elif exact < lo:
                assert value <= lo + width + slack, f"not in the bottom bin: {where}"
            else:
                assert abs(value - exact) <= width + slack, f"off by more than a bin: {where}"


def assert_same(a: pd.DataFrame, b: pd.DataFrame, drop: frozenset[str] = frozenset(),
                rtol: float = RTOL) -> None:
    """Two compute() frames hold the same cells and summaries (metrics in ``drop`` ignored)."""
    assert_no_nan(a)
    assert_no_nan(b)
    got, exp = Table.of(a, drop), Table.of(b, drop)
    _same_cells(got, exp)
    np.testing.assert_array_equal(got.col("n"), exp.col("n"))
    _close(got, exp, STATS, rtol, ATOL)
    _close(got, exp, QCOLS, 0.0, 1e-12)


# --------------------------------------------------------------------------- properties


@st.composite
def scenarios(draw):
    spec = draw(specs())
    b, q = spec.batch, spec.queries
    return {
        "spec": spec,
        "path": draw(st.sampled_from(["rows", "record", "declared"])),
        "batch_cuts": sorted(draw(st.lists(st.integers(0, b), max_size=3))),
        "query_cuts": draw(st.lists(st.integers(1, max(q - 1, 1)), max_size=2)),
        "order": draw(st.permutations(range(b))),
        "pad": draw(st.integers(1, 3)),
        "second": draw(st.none() | specs(heads=spec.heads)),
    }


@by_case
@FAST
@given(sc=scenarios())
def test_streaming_sharding_padding_and_reference(case: Case, sc: dict) -> None:
    batch = make_batch(sc["spec"])
    path, qcuts = sc["path"], sc["query_cuts"]
    bounds = [0, *sc["batch_cuts"], batch.weights.shape[0]]
    parts = [batch.take(slice(lo, hi)) for lo, hi in itertools.pairwise(bounds)]

    one = fed(case, [batch], path, qcuts)
    frame = one.compute()
    assert_matches_reference(frame, case.reference([batch]), one)
    assert_same(one.compute(), frame)  # compute() does not consume state

    assert_same(fed(case, parts, path, qcuts).compute(), frame)
    shards = [fed(case, [p], path, qcuts) for p in parts]
    before = [s.compute() for s in shards]
    fresh = case.make()
    for s in reversed(shards):
        assert fresh.merge(s) is fresh
    assert_same(fresh.compute(), frame)
    into_shard = fed(case, [parts[-1]], path, qcuts)
    for s in shards[:-1]:
        into_shard.merge(s)
    assert_same(into_shard.compute(), frame)
    for s, f in zip(shards, before, strict=True):  # merging leaves the merged-in shard alone
        assert_same(s.compute(), f)
    feed(shards[0], batch, path, qcuts)  # ... and the merged result shares no state with it
    assert_same(fresh.compute(), frame)

    permuted = batch.take(sc["order"])
    assert_same(fed(case, [permuted], path, qcuts).compute(), frame)

    padded = batch.padded(sc["pad"])
    padded_frame = fed(case, [padded], path, qcuts).compute()
    assert_same(padded_frame, frame, drop=KEY_COUNT_METRICS, rtol=1e-12)
    assert_matches_reference(padded_frame, case.reference([padded]), one)

    if sc["second"] is not None:  # another shape: more or fewer steps and keys
        other = make_batch(sc["second"])
        both = fed(case, [batch, other], path, qcuts)
        assert_matches_reference(both.compute(), case.reference([batch, other]), both)
        merged = fed(case, [other], path, qcuts).merge(fed(case, [batch], path, qcuts))
        assert_same(merged.compute(), both.compute())


@by_case
@FAST
@given(spec=specs(), cuts=st.lists(st.integers(1, 5), max_size=2))
def test_input_paths_agree(case: Case, spec: Spec, cuts: list[int]) -> None:
    """AttentionRows, a record carrying its mask, and a record with a declared mask: one result."""
    batch = make_batch(spec)
    frames = [fed(case, [batch], path, cuts).compute() for path in ("rows", "record", "declared")]
    assert_same(frames[1], frames[0])
    assert_same(frames[2], frames[0])


def reference_examples(case: Case, batches: Sequence[Batch]) -> pd.DataFrame:
    """The per-example table from the reference: one row per defined, finite value, examples
    numbered across ``batches`` in order."""
    out, first = [], 0
    for batch in batches:
        ref = batch.reference(case.tolerance)
        for metric in case.metrics:
            if metric not in ref:
                continue
            values, defined = ref[metric]
            for i, j, t in zip(*np.nonzero(defined & np.isfinite(values)), strict=True):
                out.append((first + int(i), SITE, int(j), int(t), metric, float(values[i, j, t])))
        first += batch.weights.shape[0]
    frame = pd.DataFrame(out, columns=["example", "site", "head", "step", "metric", "value"])
    return frame.sort_values(["site", "metric", "example", "head", "step"], ignore_index=True)


def assert_same_examples(got: pd.DataFrame, exp: pd.DataFrame) -> None:
    assert list(got.columns) == ["example", "site", "kind", "layer", "head", "step", "metric",
                                 "value"]
    assert not got["value"].isna().any()
    keys = ["example", "site", "head", "step", "metric"]
    assert got[keys].to_dict("list") == exp[keys].to_dict("list")
    np.testing.assert_allclose(got["value"].to_numpy(float), exp["value"].to_numpy(float),
                               rtol=RTOL, atol=ATOL)
    if len(got):
        assert (got["kind"] == KIND).all() and (got["layer"] == LAYER).all()


@by_case
@settings(FAST, max_examples=12)  # the row-by-row reference is the slow part
@given(first=specs(), second=specs(), path=st.sampled_from(["rows", "record", "declared"]),
       cuts=st.lists(st.integers(1, 5), max_size=2))
def test_per_example_rows(case: Case, first: Spec, second: Spec, path: str,
                          cuts: list[int]) -> None:
    """Opt-in per-example rows == the reference row by row, over batches and merged shards;
    the streaming summary is the same with or without them."""
    if second.heads != first.heads:
        second = Spec(**{**second.__dict__, "heads": first.heads})
    batches = [make_batch(first), make_batch(second)]
    ref = reference_examples(case, batches)
    one = case.make(per_example=True)
    for batch in batches:
        feed(one, batch, path, cuts)
    assert_same_examples(one.examples(), ref)
    assert_same(one.compute(), fed(case, batches, path, cuts).compute())
    shards = [case.make(per_example=True) for _ in batches]
    for shard, batch in zip(shards, batches, strict=True):
        feed(shard, batch, path, cuts)
    assert_same_examples(shards[0].merge(shards[1]).examples(), ref)
    with pytest.raises(ValueError, match="per_example=True"):
        fed(case, batches[:1], path, cuts).examples()
    with pytest.raises(ValueError, match="per-example rows and one without"):
        case.make().merge(case.make(per_example=True))


# --------------------------------------------------------------------------- bad input


def bad_batch(dtype: torch.dtype) -> Batch:
    """Hand-made rows: NaN / inf rows, all-masked rows of each kind, negative leaked and
    eligible weights, and large finite weights; eligibility per row."""
    k = 4
    rows = [
        ([0.1, 0.2, 0.3, 0.4], [1, 1, 1, 1]),  # clean
        ([float("nan")] * k, [1, 1, 1, 1]),  # NaN row
        ([0.5, float("inf"), 0.0, 0.0], [1, 1, 0, 0]),  # +inf on an eligible key
        ([0.5, 0.5, float("-inf"), 0.0], [1, 1, 0, 0]),  # -inf on an ineligible key
        ([float("nan")] * k, [0, 0, 0, 0]),  # all masked: NaN
        ([0.0] * k, [0, 0, 0, 0]),  # all masked: zeros
        ([0.25] * k, [0, 0, 0, 0]),  # all masked: uniform
        ([0.7, 0.1, 0.1, 0.1], [0, 0, 0, 0]),  # all masked: something else
        ([0.6, 0.6, -0.1, -0.1], [1, 1, 0, 0]),  # negative weights on ineligible keys
        ([1000.0, 2.0, 0.5, 0.0], [1, 1, 1, 0]),  # large but finite
        ([1.0, 0.0, 0.0, 0.0], [1, 0, 0, 0]),  # n_valid = 1
        ([0.0, 1.0, 0.0, 0.0], [1, 0, 1, 1]),  # all the mass on an ineligible key
        ([0.6, -0.1, 0.5, 0.0], [1, 1, 1, 0]),  # negative weight on an eligible key
        ([0.5, 0.5, 0.0, 0.0], [1, 1, 1, 1]),  # clean
    ]
    w = torch.tensor([r[0] for r in rows], dtype=torch.float64).reshape(2, 1, 7, k)
    e = torch.tensor([r[1] for r in rows], dtype=torch.bool).reshape(2, 1, 7, k)
    # scores: the weights' logs on eligible keys, NaN where the weight is NaN, -inf fills
    scores = torch.where(e | w.isnan(), w.clamp_min(1e-6).log(), float("-inf"))
    values = torch.arange(2 * k * 3, dtype=torch.float64).reshape(2, 1, k, 3) / 10
    return Batch(w.to(dtype), e, scores.to(dtype), values.to(dtype))


@by_case
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_bad_rows_are_counted_never_nan(case: Case, dtype: torch.dtype) -> None:
    batch = bad_batch(dtype)
    for path in ("rows", "record", "declared"):
        analyser = fed(case, [batch], path)
        frame = analyser.compute()
        assert len(frame)
        assert_matches_reference(frame, case.reference([batch]), analyser)


def test_bad_rows_classified() -> None:
    """The hand-made rows, summed over the batch: the numbers one can check by eye."""
    batch = bad_batch(torch.float32)
    frame = fed(NUMERICS, [batch]).compute()
    total = frame.groupby("metric")["sum"].sum()
    n = frame.groupby("metric")["n"].sum()
    assert total["non_finite"] == 4 + 1 + 1 + 4
    assert total["negative"] == 2 + 1 + 1  # two leaked negatives, the -inf, one eligible
    assert total["all_masked"] == 4
    assert n["all_masked_nan"] == 4
    assert (total["all_masked_nan"], total["all_masked_zeros"],
            total["all_masked_uniform"]) == (1, 1, 1)
    masking = fed(MASKING, [batch]).compute()
    # all-masked uniform and "something else", leaked negatives, mass on an ineligible key
    assert _sums(masking)["masked_rows"] == 4
    # undefined where the masked mass is not finite: the -inf row and the all-masked NaN row
    assert masking.groupby("metric")["n"].sum()["masked_rows"] == 14 - 2
    entropy = fed(ENTROPY, [batch]).compute()
    n_rows = entropy.groupby("metric")["n"].sum()
    assert n_rows["n_valid"] == 14
    assert n_rows["max_weight"] == 14 - 3 - 4  # no NaN/inf rows, no all-masked rows
    assert n_rows["entropy"] == 14 - 3 - 4 - 1  # nor the row with a negative eligible weight
    assert n_rows["entropy_norm"] == 14 - 3 - 4 - 1 - 1  # nor n_valid = 1


@by_case
def test_empty_batches(case: Case) -> None:
    real = make_batch(Spec(3, 2, 3, 4, torch.float32, "rows", True, False, True, True, False,
                           3.0, 7))
    for shape in [(0, 2, 3, 4), (2, 2, 0, 4), (0, 2, 0, 4)]:
        for dtype in DTYPES:
            batch = Batch(torch.zeros(shape, dtype=dtype), torch.ones(shape, dtype=torch.bool))
            for path in ("rows", "record", "declared"):
                frame = fed(case, [batch], path).compute()
                assert frame.empty
                assert list(frame.columns) == ["site", "kind", "layer", "head", "step",
                                               "metric", *NUMERIC]
                # an empty batch after a real one leaves the result unchanged
                assert_same(fed(case, [real, batch], path).compute(),
                            fed(case, [real], path).compute())


@by_case
def test_empty_batch_record_with_several_calls(case: Case) -> None:
    batch = Batch(torch.zeros(0, 2, 3, 4), torch.ones(0, 2, 3, 4, dtype=torch.bool))
    analyser = case.make()
    analyser.update(record_of(batch, cuts=[1]))
    assert analyser.compute().empty


def _paths_with_mask(mask: torch.Tensor):
    w = torch.softmax(torch.randn(2, 2, 3, 4), -1)
    yield "record", lambda a: a.update(record_of(Batch(w, mask)))
    yield "declared", lambda a: a.update(record_of(Batch(w, mask), with_mask=False),
                                         eligible=mask)


@by_case
@pytest.mark.parametrize("mask_shape", [(2, 2, 3, 5), (3, 1, 1, 4), (2, 2, 2, 4), (5,)])
def test_mask_shape_mismatch_is_value_error(case: Case, mask_shape: tuple[int, ...]) -> None:
    mask = torch.ones(mask_shape, dtype=torch.bool)
    for _, update in _paths_with_mask(mask):
        with pytest.raises(ValueError, match=r"does not broadcast to weights of shape"):
            update(case.make())


@by_case
@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8, torch.int64])
def test_non_bool_mask_is_value_error(case: Case, dtype: torch.dtype) -> None:
    mask = torch.ones(2, 1, 1, 4, dtype=dtype)
    for _, update in _paths_with_mask(mask):
        with pytest.raises(ValueError, match=r"key mask must be bool"):
            update(case.make())


@by_case
def test_rows_built_directly_are_validated(case: Case) -> None:
    w = torch.softmax(torch.randn(2, 2, 3, 4, dtype=torch.float64), -1)
    for mask, message in ((torch.ones(2, 2, 3, 5, dtype=torch.bool), "does not broadcast"),
                          (torch.ones(2, 2, 3, 4), "must be bool")):
        with pytest.raises(ValueError, match=message):
            case.make().update(AttentionRows(SITE, KIND, w, mask))
    with pytest.raises(ValueError, match="4-D tensor"):
        case.make().update(AttentionRows(SITE, KIND, w[0], torch.ones(2, 3, 4, dtype=torch.bool)))


class _Fake:
    """The duck-typed record interface AttentionRows.of reads."""

    def __init__(self, weights: torch.Tensor) -> None:
        self.weights, self.key_mask, self.name, self.kind = weights, None, SITE, KIND


@by_case
@pytest.mark.parametrize("shape", [(2, 3, 4), (4,), (1, 2, 3, 4, 5)])
def test_weights_not_4d_is_value_error(case: Case, shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match=r"4-D tensor"):
        case.make().update(_Fake(torch.rand(shape)))
    if len(shape) == 3:  # through a real record too
        rec = AttentionRecord(Site(SITE, KIND, "tap", "m"))
        rec.append(AttentionCall(weights=torch.rand(shape)))
        with pytest.raises(ValueError, match=r"4-D tensor"):
            case.make().update(rec)


@by_case
def test_integer_weights_are_value_error(case: Case) -> None:
    with pytest.raises(ValueError, match=r"floating point"):
        case.make().update(_Fake(torch.ones(1, 1, 2, 2, dtype=torch.int64)))


@pytest.mark.parametrize("pair", [(a, b) for a in CASES for b in CASES
                                  if type(a.make()) is not type(b.make())],
                         ids=lambda p: f"{p[0].id}<-{p[1].id}")
def test_merging_different_types_is_type_error(pair: tuple[Case, Case]) -> None:
    a, b = (c.make() for c in pair)
    feed(b, bad_batch(torch.float32))
    with pytest.raises(TypeError, match="cannot merge"):
        a.merge(b)
    assert a.compute().empty


def _plain(batch: int, heads: int, seed: int) -> Batch:
    return make_batch(Spec(batch, heads, 3, 4, torch.float32, "rows", *[False] * 5, 1.0, seed))


@by_case
def test_update_with_different_head_counts_is_value_error(case: Case) -> None:
    analyser = fed(case, [_plain(2, 3, 1)])
    with pytest.raises(ValueError, match="heads"):
        feed(analyser, _plain(2, 1, 2))


@by_case
def test_merging_different_head_counts_is_value_error(case: Case) -> None:
    """A 1-head shard must not be numpy-broadcast into every head of a 3-head shard."""
    one, three = fed(case, [_plain(2, 1, 1)]), fed(case, [_plain(2, 3, 2)])
    with pytest.raises(ValueError, match="heads"):
        one.merge(three)
    with pytest.raises(ValueError, match="heads"):
        three.merge(one)


@by_case
def test_reset_empties_state(case: Case) -> None:
    batch = make_batch(Spec(4, 2, 3, 5, torch.float16, "keys", True, True, True, True, True,
                            3.0, 11))
    analyser = fed(case, [batch])
    assert len(analyser.compute())
    analyser.reset()
    assert analyser.compute().empty
    other = _plain(2, 3, 5)
    feed(analyser, other)  # head count may change after a reset
    assert_same(analyser.compute(), fed(case, [other]).compute())


@by_case
@pytest.mark.parametrize("rank", [2, 3])
def test_declared_mask_by_rank_is_per_example(case: Case, rank: int) -> None:
    """A (B, K) mask is per example and (B, Q, K) per example and query, even when B == Q
    (right-aligned broadcasting once read (B, K) as (Q, K) without a word)."""
    gen = torch.Generator().manual_seed(rank)
    logits = torch.randn(3, 2, 3, 4, dtype=torch.float64, generator=gen)
    shape = (3, 4) if rank == 2 else (3, 3, 4)
    mask = torch.rand(shape, generator=gen) < 0.6
    mask[..., 0] = True
    full = mask[:, None, None, :] if rank == 2 else mask[:, None, :, :]
    batch = Batch(torch.softmax(logits, -1), full, logits,
                  torch.randn(3, 2, 4, 2, dtype=torch.float64, generator=gen))
    analyser = case.make()
    analyser.update(record_of(batch, with_mask=False), eligible=mask)
    assert_matches_reference(analyser.compute(), case.reference([batch]), analyser)
    wrong = torch.ones(5, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"read as \(B, K\)"):
        case.make().update(record_of(batch, with_mask=False), eligible=wrong)


# --------------------------------------------------------------------------- regressions


def test_all_masked_row_does_not_veto_softmax_axis_suspect() -> None:
    """A row without eligible keys (or with non-finite weights) is not judged; it once vetoed
    the flag for its whole (example, head)."""
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(1, 1, 3, 3, dtype=torch.float64, generator=gen)
    w = torch.softmax(scores, dim=-2)  # columns sum to 1, rows do not
    eligible = torch.ones(1, 1, 3, 3, dtype=torch.bool)
    eligible[0, 0, 0] = False  # e.g. a padded query row under a declared rule
    batch = Batch(w, eligible)
    ref = aggregate(SITE, [batch.reference()], ["softmax_axis_suspect"])
    assert ref["mean"].eq(1.0).all()  # the reference flags every row
    frame = fed(NUMERICS, [batch]).compute()
    got = frame[frame["metric"] == "softmax_axis_suspect"]
    assert got["mean"].eq(1.0).all(), got


def test_huge_values_land_in_the_top_bin() -> None:
    """Values far beyond a metric's histogram range go to the top bin (they were once cast
    to int64 before clipping: overflow -> INT64_MIN -> bottom bin)."""
    w = torch.zeros(10, 1, 1, 2, dtype=torch.float64)
    w[:, 0, 0, 0] = 1.0
    w[8:, 0, 0, 0] = 1e20  # finite, absurd: row_sum_error ~ 1e20
    batch = Batch(w, torch.ones(10, 1, 1, 2, dtype=torch.bool))
    analyser = fed(NUMERICS, [batch])
    frame = analyser.compute()
    assert_matches_reference(frame, NUMERICS.reference([batch]), analyser)


def test_max_weight_is_over_eligible_keys_only() -> None:
    """It was once the max with ineligible keys zeroed: 0 here, an ineligible key."""
    w = torch.tensor([[[[-0.5, -0.2, 0.7]]]], dtype=torch.float64)
    batch = Batch(w, torch.tensor([True, True, False]).expand(1, 1, 1, 3))
    frame = fed(ENTROPY, [batch]).compute()
    assert frame.loc[frame["metric"] == "max_weight", "max"].item() == -0.2


def test_padding_changes_only_key_count_metrics() -> None:
    """What the padding invariance deliberately leaves out, shown on two small cases: a
    uniform all-masked row stops being uniform (1/K changed), and each padded key is one
    more -inf masking fill. Both follow the definitions. A wrong-axis head stays suspect:
    a padded column (sum 0) is no column of the distribution."""
    uniform = Batch(torch.full((1, 1, 2, 4), 0.25), torch.zeros(1, 1, 2, 4, dtype=torch.bool))
    before, after = (_sums(fed(NUMERICS, [b]).compute())["all_masked_uniform"]
                     for b in (uniform, uniform.padded(2)))
    assert (before, after) == (2, 0)
    logits = torch.randn(1, 1, 3, 3, generator=torch.Generator().manual_seed(0))
    wrong = Batch(torch.softmax(logits, -2), torch.ones(1, 1, 3, 3, dtype=torch.bool), logits)
    before, after = (_sums(fed(NUMERICS, [b]).compute())["softmax_axis_suspect"]
                     for b in (wrong, wrong.padded(2)))
    assert before == after == 3
    before, after = (_sums(fed(SCORES, [b]).compute())["masked_score_non_finite"]
                     for b in (wrong, wrong.padded(2)))
    assert (before, after) == (0, 3 * 2)


# --------------------------------------------------------------------------- model level


class PostMaskAttention(nn.Module):
    """Dot-product attention that masks padding AFTER the softmax (no renormalising), or
    fills masked scores with 0 instead of -inf: both leak mass onto padding."""

    def __init__(self, d: int = 8, mode: str = "post") -> None:
        super().__init__()
        self.q, self.k = nn.Linear(d, d), nn.Linear(d, d)
        self.mode = mode

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        scores = self.q(x) @ self.k(x).transpose(-1, -2) / math.sqrt(x.shape[-1])
        if self.mode == "zero-fill":
            scores = scores.masked_fill(~keep[:, None, :], 0.0)
        elif self.mode == "correct":
            scores = scores.masked_fill(~keep[:, None, :], float("-inf"))
        w = torch.softmax(scores, dim=-1)
        if self.mode == "post":
            w = w * keep[:, None, :]
        return w @ x


class WrongAxisAttention(nn.Module):
    """Cross attention whose softmax runs over the query axis of (B, Q, K) scores."""

    def __init__(self, d: int = 8, dim: int = -2) -> None:
        super().__init__()
        self.q, self.k = nn.Linear(d, d), nn.Linear(d, d)
        self.dim = dim

    def forward(self, queries: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        scores = self.q(queries) @ self.k(memory).transpose(-1, -2)
        return torch.softmax(scores, dim=self.dim) @ memory


class Wrap(nn.Module):
    def __init__(self, attn: nn.Module) -> None:
        super().__init__()
        self.attn = attn

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.attn(*args)


def _captured(model: nn.Module, *inputs: torch.Tensor) -> AttentionRecord:
    with torch.no_grad(), attnaudit.capture(model) as cap:
        model(*inputs)
    (record,) = cap.records.values()
    return record


def _sums(frame: pd.DataFrame) -> pd.Series:
    return frame.groupby("metric")["sum"].sum()


@pytest.mark.parametrize("mode", ["post", "zero-fill", "correct"])
def test_leaky_model_shows_masked_mass_against_declared_mask(mode: str) -> None:
    torch.manual_seed(0)
    model = Wrap(PostMaskAttention(mode=mode))
    x = torch.randn(3, 5, 8)
    keep = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]], dtype=torch.bool)
    record = _captured(model, x, keep)
    declared = keep[:, None, None, :]
    for case in CASES:  # every analyser agrees with the reference on the captured record
        analyser = case.make()
        analyser.update(record, eligible=declared)
        batch = Batch(record.weights, declared, record.scores, record.values)
        ref = aggregate(record.name, [batch.reference(case.tolerance)], case.metrics)
        assert_matches_reference(analyser.compute(), ref, analyser, kind=record.kind,
                                 layer=None)
    masking = MaskingAnalyser()
    masking.update(record, eligible=declared)
    leaked = _sums(masking.compute())
    blind = MaskingAnalyser()
    blind.update(record)  # eligibility read off the scores shares the model's mistake
    if mode == "correct":
        assert leaked["masked_rows"] == 0
        assert leaked["masked_mass"] == 0
    else:
        assert leaked["masked_rows"] == 2 * 5  # every query row of the two padded examples
        assert leaked["masked_mass"] > 0.1
        assert _sums(blind.compute())["masked_mass"] == 0


@pytest.mark.parametrize(("queries", "keys"), [(4, 4), (3, 6), (6, 2)])
def test_wrong_axis_softmax_is_flagged(queries: int, keys: int) -> None:
    torch.manual_seed(1)
    q, m = torch.randn(2, queries, 8), torch.randn(2, keys, 8)
    numerics = NumericsAnalyser()
    record = _captured(Wrap(WrongAxisAttention(dim=-2)), q, m)
    # Capture takes the normalised axis as the keys; the layout says it precedes the queries.
    assert record.site.layout == "b k q"
    assert record.weights.shape == (2, 1, keys, queries)
    numerics.update(record)
    frame = numerics.compute()
    suspect = frame[frame["metric"] == "softmax_axis_suspect"]
    assert len(suspect) == keys and (suspect["mean"] == 1.0).all()
    right = NumericsAnalyser()
    right.update(_captured(Wrap(WrongAxisAttention(dim=-1)), q, m))
    frame = right.compute()
    assert (frame.loc[frame["metric"] == "softmax_axis_suspect", "sum"] == 0).all()
    assert (frame.loc[frame["metric"] == "row_sum_error", "max"] < 1e-6).all()
