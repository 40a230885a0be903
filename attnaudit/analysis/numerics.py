"""Numeric health of every row (docs/metrics.md, "Validity").

non_finite / negative: counts of NaN-or-inf / below-zero weights per row.
row_sum_error: |sum over keys - 1| for rows with an eligible key and finite weights; the
weight on sink columns (``AttentionRecord.sink``) counts in the sum.
all_masked: 1 for a row with no eligible key; what the model produced there is classified
as all_masked_nan, all_masked_zeros or all_masked_uniform (else none of the three).
softmax_axis_suspect: 1 on every row of an (example, head) whose rows do not sum to one
while its columns (the query axis) do — the mark of a softmax over the wrong dimension —
and on every row of a site whose softmax normalised an axis that precedes a query axis in
the model's own tensor (layout ``b k q``: capture takes the normalised axis as the keys, so
such rows sum to one however wrong the axis was).
row_sum_rows / non_finite_rows / negative_rows: 1 for a row whose row_sum_error exceeds
``tolerance`` / that holds a NaN-or-inf / a negative weight; their ``sum`` counts such rows
(what a CI gate fails on).

Rows without an eligible key or with non-finite weights are not judged, nor are key
columns that no query may attend (padding), nor prompt-view rows whose keys held none of
the raw row (``AttentionRows.zero_view``: the view's mass underflowed to exactly 0, a zero
row with no distribution to judge). zero_view_rows: 1 for such a row (interventions leave
it out as ``negligible view mass``, :mod:`attnaudit.analysis.degenerate`).

With ``tolerance=None`` (what the validity audit and the gate use) the row-sum tolerance
follows from the dtype the model produced the weights in and the number of keys K
(:func:`row_sum_tolerance`): ``max(1e-3, u * (1 + ceil(log2 K)))`` with
``u = finfo(dtype).eps / 2`` the unit roundoff. Storing each weight rounds it by at most
``u`` relative, at most ``u`` on a sum of weights that sum to one; a softmax that
normalises in that dtype adds one rounding per level of a pairwise sum, ``ceil(log2 K)``
levels. float32: 1e-3 (the floor); bfloat16 (u = 2^-8), K = 40: 0.027; float16
(u = 2^-11), K = 40: 0.0034. Masked mass keeps one tolerance in every dtype: a correct
mask gives masked keys exactly zero weight in any precision (the exponential underflows).
"""

from __future__ import annotations

import math

import torch

from attnaudit.analysis.base import Analyser, AttentionRows
from attnaudit.analysis.stats import MetricSpec

SUM_TOLERANCE = 1e-3  # the floor of the row-sum tolerance: float32 and wider dtypes


def row_sum_tolerance(dtype: torch.dtype | None, keys: int) -> float:
    """The default |row sum - 1| tolerance for weights of ``dtype`` over ``keys`` keys (see
    the module docstring); None (unknown) counts as float32."""
    unit = torch.finfo(dtype if dtype is not None and dtype.is_floating_point
                       else torch.float32).eps / 2
    return max(SUM_TOLERANCE, unit * (1 + math.ceil(math.log2(max(keys, 1)))))



class NumericsAnalyser(Analyser):
    metrics = (
        MetricSpec("non_finite", 0.0, 256.0),
        MetricSpec("negative", 0.0, 256.0),
        MetricSpec("row_sum_error", 0.0, 1.0),
        MetricSpec("all_masked", 0.0, 1.0),
        MetricSpec("all_masked_nan", 0.0, 1.0),
        MetricSpec("all_masked_zeros", 0.0, 1.0),
        MetricSpec("all_masked_uniform", 0.0, 1.0),
        MetricSpec("softmax_axis_suspect", 0.0, 1.0),
        MetricSpec("row_sum_rows", 0.0, 1.0),
        MetricSpec("non_finite_rows", 0.0, 1.0),
        MetricSpec("negative_rows", 0.0, 1.0),
        MetricSpec("zero_view_rows", 0.0, 1.0),
    )

    def __init__(self, tolerance: float | None = SUM_TOLERANCE,
                 per_example: bool = False) -> None:
        """tolerance: largest |row sum - 1| (and column sum, for the wrong-axis check)
        counted as summing to one; None: :func:`row_sum_tolerance` of the rows' dtype."""
        super().__init__(per_example)
        self.tolerance = tolerance

    def rows_metrics(self, rows: AttentionRows
                     ) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
        w = rows.weights
        tolerance = (row_sum_tolerance(rows.dtype, w.shape[-1]) if self.tolerance is None
                     else self.tolerance)
        finite = torch.isfinite(w)
        row_finite = finite.all(-1)
        has_keys = rows.n_valid > 0
        sums = w.sum(-1) if rows.sink is None else w.sum(-1) + rows.sink.to(w.device)
        row_sum_error = (sums - 1).abs()
        zero_view = rows.zero_view
        judged = has_keys & row_finite & ~zero_view  # rows whose sum means something
        all_masked = ~has_keys
        n_keys = w.shape[-1]
        nan_row = ~row_finite
        # zero_row and uniform_row count on all-masked rows only: on CPU, where looking is
        # cheap, two passes over the weights are skipped when there are none (an
        # accelerator would wait at every call for the answer, so they run regardless)
        if w.device.type == "cpu" and not bool(all_masked.any()):
            zero_row = uniform_row = all_masked
        else:
            zero_row = row_finite & (w == 0).all(-1)
            uniform_row = row_finite & ((w - 1.0 / max(n_keys, 1)).abs() <= 1e-6).all(-1)
        rows_bad = (row_sum_error > tolerance) | ~judged
        # A key no query may attend (padding) is no column of the distribution: its sum is
        # not judged, so padding keys neither veto nor support the flag.
        used = rows.eligible.any(-2)  # (B, H, K)
        cols_ok = (((w.sum(-2) - 1).abs() <= tolerance) | ~used).all(-1)  # (B, H)
        suspect = (rows_bad.all(-1) & judged.any(-1) & cols_ok & (w.shape[2] > 1)) \
            | rows.keys_before_queries
        suspect = suspect[..., None].expand_as(rows_bad)
        f64 = torch.float64
        non_finite = (~finite).sum(-1)
        negative = (w < 0).sum(-1)
        return {
            "non_finite": (non_finite.to(f64), None),
            "negative": (negative.to(f64), None),
            "row_sum_error": (row_sum_error, judged),
            "all_masked": (all_masked.to(f64), None),
            "all_masked_nan": (nan_row.to(f64), all_masked),
            "all_masked_zeros": (zero_row.to(f64), all_masked),
            "all_masked_uniform": (uniform_row.to(f64), all_masked),
            "softmax_axis_suspect": (suspect.to(f64), None),
            "row_sum_rows": ((row_sum_error > tolerance).to(f64), judged),
            "non_finite_rows": ((non_finite > 0).to(f64), None),
            "negative_rows": ((negative > 0).to(f64), None),
            "zero_view_rows": (zero_view.to(f64), None),
        }
