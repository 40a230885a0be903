"""Independent reference implementations of the per-row attention metrics.

Written from docs/metrics.md ("Eligibility", "Validity", "Shape of the distribution"), in
plain numpy, one row at a time. Nothing here imports attnaudit:
the point is to have a second, deliberately naive implementation to compare against.

Conventions (the reference's reading of the definitions):

* Inputs are float64 arrays ``weights`` of shape (batch, heads, queries, keys) and a bool
  ``eligible`` broadcastable to it (True = the key may be attended).
* Every per-row metric is returned as ``(values, defined)``, both (batch, heads, queries);
  ``values`` is NaN where ``defined`` is False.
* A row is *finite* when every one of its weights (eligible or not) is finite.
* Entropy metrics (entropy, entropy_norm, effective_keys, kl_to_uniform, max_weight) are
  defined only for finite rows with at least one eligible key; entropy_norm also needs
  ``n_valid >= 2``. A negative eligible weight leaves the entropy family undefined here
  (``ln`` of a negative number; docs/metrics.md does not say), but not ``max_weight``.
  ``n_valid`` is defined for every row (it depends on the mask only).
* ``masked_mass`` / ``masked_rows`` are defined where the masked mass is finite (a NaN or
  inf on an *ineligible* key leaves it undefined; one on an eligible key does not matter).
* ``non_finite``, ``negative``, their ``*_rows`` flags, ``all_masked`` and
  ``softmax_axis_suspect`` are defined for every row; ``row_sum_error`` and ``row_sum_rows``
  (``row_sum_error > 1e-3``) for finite rows with an eligible key; ``all_masked_*`` only
  for rows with no eligible key. ``all_masked_nan`` reads "the model produced a non-finite
  row" (NaN, or +-inf) - a softmax over all ``-inf`` gives NaN.
* ``softmax_axis_suspect`` (per example and head, broadcast to its rows): more than one
  query, at least one row that has an eligible key and finite weights, every such row has
  ``|sum - 1| > 1e-3``, and every column (key, summed over queries) that is eligible for at
  least one query is within 1e-3 of 1. Rows without an eligible key, or with non-finite
  weights, are *ignored* by the row condition, and columns eligible for no query (padding)
  by the column condition (they neither veto nor support the flag).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

EPS = 1e-10
MASK_TOLERANCE = 1e-6
SUM_TOLERANCE = 1e-3
UNIFORM_TOLERANCE = 1e-6
QUANTILES = (0.1, 0.5, 0.9)

ENTROPY_METRICS = ("entropy", "entropy_norm", "effective_keys", "kl_to_uniform", "max_weight",
                   "n_valid")
MASKING_METRICS = ("masked_mass", "masked_rows")
NUMERICS_METRICS = ("non_finite", "negative", "row_sum_error", "all_masked", "all_masked_nan",
                    "all_masked_zeros", "all_masked_uniform", "softmax_axis_suspect",
                    "row_sum_rows", "non_finite_rows", "negative_rows", "zero_view_rows")
ALL_METRICS = ENTROPY_METRICS + MASKING_METRICS + NUMERICS_METRICS
SCORE_METRICS = ("score_min", "score_max", "score_mean", "score_non_finite",
                 "masked_score_min", "masked_score_max", "masked_score_non_finite")
OUTPUT_METRICS = ("output_norm",)

PerRow = dict[str, tuple[np.ndarray, np.ndarray]]


def row_metrics(w: Sequence[float], eligible: Sequence[bool],
                tolerance: float = MASK_TOLERANCE) -> dict[str, float | None]:
    """Every row-local metric of one row (1-D float64 weights over keys); None = undefined."""
    w = [float(x) for x in w]  # Python floats: inf - inf is NaN without a numpy warning
    n_keys = len(w)
    n_valid = int(sum(bool(e) for e in eligible))
    finite = all(math.isfinite(x) for x in w)
    out: dict[str, float | None] = dict.fromkeys(ALL_METRICS)
    out["n_valid"] = float(n_valid)

    if finite and n_valid >= 1:
        kept = [x for x, e in zip(w, eligible, strict=True) if e]
        out["max_weight"] = max(kept)
        if min(kept) >= 0:  # a negative weight has no entropy (docs/metrics.md is silent)
            h = 0.0
            for x in kept:
                h -= x * math.log(x + EPS)
            out["entropy"] = h
            out["effective_keys"] = math.exp(h)
            out["kl_to_uniform"] = math.log(n_valid) - h
            if n_valid >= 2:
                out["entropy_norm"] = h / math.log(n_valid)

    masked = 0.0
    for x, e in zip(w, eligible, strict=True):
        if not e:
            masked += abs(x)
    if math.isfinite(masked):
        out["masked_mass"] = masked
        out["masked_rows"] = float(masked > tolerance)

    out["non_finite"] = float(sum(not math.isfinite(x) for x in w))
    out["negative"] = float(sum(x < 0 for x in w))
    out["non_finite_rows"] = float(out["non_finite"] > 0)
    out["negative_rows"] = float(out["negative"] > 0)
    out["zero_view_rows"] = 0.0  # a row of weights alone is no prompt view
    if finite and n_valid >= 1:
        out["row_sum_error"] = abs(sum(w) - 1.0)
        out["row_sum_rows"] = float(out["row_sum_error"] > SUM_TOLERANCE)
    out["all_masked"] = float(n_valid == 0)
    if n_valid == 0:
        out["all_masked_nan"] = float(not finite)
        out["all_masked_zeros"] = float(finite and all(x == 0 for x in w))
        out["all_masked_uniform"] = float(
            finite and all(abs(x - 1.0 / n_keys) <= UNIFORM_TOLERANCE for x in w))
    return out


def axis_suspect(w: np.ndarray, eligible: np.ndarray) -> bool:
    """softmax_axis_suspect for one (example, head): ``w`` and ``eligible`` are (queries, keys)."""
    n_queries = w.shape[0]
    if n_queries <= 1:
        return False
    judged = []
    for q in range(n_queries):
        if eligible[q].any() and all(math.isfinite(x) for x in w[q]):
            judged.append(abs(sum(w[q]) - 1.0) > SUM_TOLERANCE)
    if not judged or not all(judged):
        return False
    for k in range(w.shape[1]):
        if not eligible[:, k].any():
            continue
        column = sum(float(w[q, k]) for q in range(n_queries))
        if not abs(column - 1.0) <= SUM_TOLERANCE:  # NaN fails too
            return False
    return True


def per_row(weights: np.ndarray, eligible: np.ndarray,
            tolerance: float = MASK_TOLERANCE) -> PerRow:
    """metric -> (values, defined), both (batch, heads, queries), for one batch."""
    weights = np.asarray(weights, dtype=np.float64)
    if weights.ndim != 4:
        raise ValueError("reference expects (batch, heads, queries, keys)")
    eligible = np.broadcast_to(np.asarray(eligible, dtype=bool), weights.shape)
    b, h, q, _ = weights.shape
    values = {m: np.full((b, h, q), np.nan) for m in ALL_METRICS}
    for i in range(b):
        for j in range(h):
            suspect = float(axis_suspect(weights[i, j], eligible[i, j]))
            for t in range(q):
                row = row_metrics(weights[i, j, t], eligible[i, j, t], tolerance)
                row["softmax_axis_suspect"] = suspect
                for m, v in row.items():
                    if v is not None:
                        values[m][i, j, t] = v
    return {m: (v, ~np.isnan(v)) for m, v in values.items()}


def score_row_metrics(scores: Sequence[float], eligible: Sequence[bool]) -> dict[str, float | None]:
    """Score metrics of one row: ranges over finite scores, eligible and ineligible apart."""
    out: dict[str, float | None] = {}
    for prefix, want in (("score", True), ("masked_score", False)):
        picked = [float(x) for x, e in zip(scores, eligible, strict=True) if bool(e) == want]
        finite = [x for x in picked if math.isfinite(x)]
        out[f"{prefix}_min"] = min(finite) if finite else None
        out[f"{prefix}_max"] = max(finite) if finite else None
        out[f"{prefix}_non_finite"] = float(len(picked) - len(finite))
        if prefix == "score":
            out["score_mean"] = sum(finite) / len(finite) if finite else None
    return out


def output_norm(w: Sequence[float], values: np.ndarray) -> float:
    """||sum_j w_j v_j||_2 for one row: ``values`` is (keys, d_v); every key counts."""
    d_v = values.shape[1]
    out = [sum(float(w[j]) * float(values[j, d]) for j in range(len(w))) for d in range(d_v)]
    return math.sqrt(sum(x * x for x in out))


def per_row_scores(weights: np.ndarray, eligible: np.ndarray, scores: np.ndarray | None,
                   values: np.ndarray | None) -> PerRow:
    """Score metrics (when ``scores`` (B, H, Q, K) is given) and output_norm (when
    ``values`` (B, Hv, K, d_v), Hv dividing H, is given): metric -> (values, defined)."""
    weights = np.asarray(weights, dtype=np.float64)
    eligible = np.broadcast_to(np.asarray(eligible, dtype=bool), weights.shape)
    b, h, q, _ = weights.shape
    metrics = (SCORE_METRICS if scores is not None else ()) + (
        OUTPUT_METRICS if values is not None else ())
    out = {m: np.full((b, h, q), np.nan) for m in metrics}
    for i in range(b):
        for j in range(h):
            for t in range(q):
                row: dict[str, float | None] = {}
                if scores is not None:
                    row.update(score_row_metrics(scores[i, j, t], eligible[i, j, t]))
                if values is not None:
                    group = h // values.shape[1]
                    row["output_norm"] = output_norm(weights[i, j, t], values[i, j // group])
                for m, v in row.items():
                    if v is not None and math.isfinite(v):
                        out[m][i, j, t] = v
    return {m: (v, ~np.isnan(v)) for m, v in out.items()}


def exact_quantile(values: np.ndarray, q: float) -> float:
    """Inverted-CDF quantile: the ceil(q * n)-th smallest value (1-based)."""
    ordered = np.sort(values)
    k = max(math.ceil(q * len(ordered)), 1)
    return float(ordered[k - 1])


def aggregate(site: str, batches: Iterable[Mapping[str, tuple[np.ndarray, np.ndarray]]],
              metrics: Iterable[str] = ALL_METRICS) -> pd.DataFrame:
    """Exact summaries per (site, head, step, metric) over one or more batches of rows.

    Batches may have different numbers of query steps (heads must agree). Only finite
    values of defined rows count (a summary is never NaN or inf); a cell appears only when
    at least one such value reached it. Columns: site, head, step, metric, n,
    mean, sum, min, max, q10, q50, q90 (quantiles exact, inverted CDF).
    """
    batches = list(batches)
    out = []
    for metric in metrics:
        parts = [b[metric] for b in batches if metric in b]
        if not parts:
            continue
        heads = {v.shape[1] for v, _ in parts}
        if len(heads) != 1:
            raise ValueError(f"head counts differ across batches: {sorted(heads)}")
        (n_heads,) = heads
        n_steps = max(v.shape[2] for v, _ in parts)
        for head in range(n_heads):
            for step in range(n_steps):
                chunks = [v[:, head, step][d[:, head, step] & np.isfinite(v[:, head, step])]
                          for v, d in parts if step < v.shape[2]]
                vals = np.concatenate(chunks) if chunks else np.empty(0)
                if vals.size == 0:
                    continue
                row = {"site": site, "head": head, "step": step, "metric": metric,
                       "n": int(vals.size), "mean": float(np.sum(vals) / vals.size),
                       "sum": float(np.sum(vals)), "min": float(np.min(vals)),
                       "max": float(np.max(vals))}
                for qq in QUANTILES:
                    row[f"q{round(qq * 100)}"] = exact_quantile(vals, qq)
                out.append(row)
    columns = ["site", "head", "step", "metric", "n", "mean", "sum", "min", "max",
               *(f"q{round(q * 100)}" for q in QUANTILES)]
    frame = pd.DataFrame(out, columns=columns)
    return frame.sort_values(["site", "metric", "head", "step"], ignore_index=True)
