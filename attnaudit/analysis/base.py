"""The analyser interface: ``update`` / ``compute`` / ``merge`` / ``reset``.

An analyser folds :class:`~attnaudit.record.AttentionRecord` batches into
:class:`~attnaudit.analysis.stats.RowStats` and reports a tidy DataFrame with one row per
site x head x query step x metric and its count ``n``. Two analysers of the same type
merge by adding their states, so an audit can be sharded and combined.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar, Self

import pandas as pd
import torch

from attnaudit.analysis.per_example import ExampleRows
from attnaudit.analysis.stats import MetricSpec, RowStats
from attnaudit.errors import AnalysisError
from attnaudit.record import AttentionRecord


@dataclass
class AttentionRows:
    """One batch of attention rows, validated and in float64.

    weights: (batch, heads, queries, keys). eligible: bool, same shape. dtype: the weights'
    dtype as the model produced them (None: unknown), which sets numeric tolerances.
    keys_before_queries: the model's softmax normalised an axis that comes before a query
    axis in its own tensor (``Site.layout`` such as ``"b k q"``), which is how a softmax over
    the wrong axis of ``(B, Q, K)`` scores looks. sink: (batch, heads, queries) float64, the
    weight each row put on sink columns (no keys: a row's keys plus its sink sum to one),
    None when the site has none. share: (batch, heads, queries) float64, for a prompt view
    (``AttentionRecord.share``) the share of the raw row its keys held, None for any other
    site.
    """

    site: str
    kind: str | None
    weights: torch.Tensor
    eligible: torch.Tensor
    step_offset: int = 0
    dtype: torch.dtype | None = None
    keys_before_queries: bool = False
    sink: torch.Tensor | None = None
    share: torch.Tensor | None = None

    @classmethod
    def of(cls, record: AttentionRecord | AttentionRows,
           eligible: torch.Tensor | None = None) -> AttentionRows:
        """The rows of a record; ``eligible`` (bool, read by rank as in :func:`as_4d`)
        overrides its key mask."""
        name = record.site if isinstance(record, AttentionRows) else record.name
        weights = record.weights
        if not isinstance(weights, torch.Tensor) or weights.ndim != 4:
            raise AnalysisError(f"site {name!r}: weights must be a 4-D tensor "
                                "(batch, heads, queries, keys)")
        if not weights.is_floating_point():
            raise AnalysisError(f"site {name!r}: weights must be floating point, "
                                f"got {weights.dtype}")
        if weights.is_meta:
            raise AnalysisError(f"site {name!r}: the weights are on the meta device, which holds "
                                "shapes but no data; load the model's weights before analysing")
        if (isinstance(record, AttentionRows) and eligible is None
                and weights.dtype == torch.float64
                and record.eligible.dtype == torch.bool
                and record.eligible.shape == weights.shape):
            return record  # nothing to convert or check
        produced = record.dtype if isinstance(record, AttentionRows) else weights.dtype
        weights = weights.detach().to(torch.float64)
        if isinstance(record, AttentionRows):
            mask = record.eligible if eligible is None else eligible
            return cls(record.site, record.kind, weights,
                       _eligibility(record.site, weights, mask), record.step_offset, produced,
                       record.keys_before_queries, record.sink, record.share)
        key_mask = record.key_mask if eligible is None else eligible
        sink, share = record.sink, record.share
        return cls(record.name, record.kind, weights, _eligibility(record.name, weights, key_mask),
                   dtype=produced, keys_before_queries=keys_before_queries(record.site.layout),
                   sink=None if sink is None else sink[..., 0].detach().to(torch.float64),
                   share=None if share is None else share[..., 0].detach().to(torch.float64))

    @cached_property
    def n_valid(self) -> torch.Tensor:
        """Eligible keys per row (batch, heads, queries)."""
        return self.eligible.sum(-1)

    @cached_property
    def finite(self) -> torch.Tensor:
        """Bool (batch, heads, queries): every weight in the row is finite."""
        return torch.isfinite(self.weights).all(-1)

    @cached_property
    def zero_view(self) -> torch.Tensor:
        """Bool (batch, heads, queries): prompt-view rows whose keys held exactly none of
        the raw row: the view's mass underflowed to 0 in the weights' dtype (a float32 model
        that put, say, 1e-46 of a row on the prompt), so the view is a zero row, no
        distribution to judge. (A view of subnormal mass is renormalised exactly and sums
        to one.) Interventions leave such rows out as ``negligible view mass``
        (:mod:`attnaudit.analysis.degenerate`)."""
        if self.share is None:
            return torch.zeros(self.weights.shape[:3], dtype=torch.bool,
                               device=self.weights.device)
        return self.share.to(self.weights.device) == 0

    @cached_property
    def eligible_weights(self) -> torch.Tensor:
        """Weights with ineligible keys set to 0 (batch, heads, queries, keys)."""
        return self.weights.where(self.eligible, 0.0)


def keys_before_queries(layout: str) -> bool:
    """True when a site's own layout (``Site.layout``, e.g. ``"b k q"``) puts the normalised
    axis before a query axis: the mark of a softmax over the wrong axis of (B, Q, K)."""
    axes = layout.split()
    return "k" in axes and "q" in axes[axes.index("k"):]


RANK_LAYOUTS = {1: "(K,)", 2: "(B, K)", 3: "(B, Q, K)", 4: "(B, H, Q, K)"}


def as_4d(site: str, tensor: torch.Tensor, shape: tuple[int, ...], what: str) -> torch.Tensor:
    """A per-key tensor read by its rank and broadcast to ``shape`` = (B, H, Q, K).

    (K,) the same keys for every row; (B, K) per example; (B, Q, K) per example and query
    row; (B, H, Q, K) in full; size-1 axes broadcast. A (B, K) mask is never read as
    (Q, K) (plain right-aligned broadcasting would do that silently when B == Q): give a
    per-row rule as (1, Q, K) or (1, 1, Q, K).
    """
    if tensor.ndim not in RANK_LAYOUTS:
        raise AnalysisError(
            f"site {site!r}: {what} of shape {tuple(tensor.shape)} has {tensor.ndim} dims; "
            f"give (K,), (B, K), (B, Q, K) or (B, H, Q, K) for weights of shape {shape}")
    view = {1: lambda t: t[None, None, None], 2: lambda t: t[:, None, None],
            3: lambda t: t[:, None], 4: lambda t: t}[tensor.ndim](tensor)
    try:
        return view.expand(shape)
    except RuntimeError:
        raise AnalysisError(
            f"site {site!r}: {what} of shape {tuple(tensor.shape)} (read as "
            f"{RANK_LAYOUTS[tensor.ndim]}) does not broadcast to weights of shape {shape} "
            "(batch, heads, queries, keys)"
        ) from None


def _eligibility(site: str, weights: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return torch.ones_like(weights, dtype=torch.bool)
    if mask.dtype != torch.bool:
        raise AnalysisError(f"site {site!r}: key mask must be bool (True = eligible), "
                            f"got {mask.dtype}")
    return as_4d(site, mask.to(weights.device), tuple(weights.shape), "key mask")


class Analyser:
    """Base class. Subclasses declare ``metrics`` and implement :meth:`rows_metrics`.

    ``per_example=True`` also keeps one row per example x site x head x step x metric
    (a table that grows with the data), read with :meth:`examples`; the streaming summary
    of :meth:`compute` is the same either way.
    """

    metrics: ClassVar[tuple[MetricSpec, ...]] = ()

    def __init__(self, per_example: bool = False) -> None:
        self.stats = RowStats(self.metrics)
        self.example_rows = ExampleRows() if per_example else None

    def update(self, record: AttentionRecord | AttentionRows, *,
               eligible: torch.Tensor | None = None) -> None:
        """Fold one record (or batch of rows) in.

        ``eligible`` declares the key rule (bool, True = eligible), read by rank: (K,),
        (B, K) per example, (B, Q, K), or (B, H, Q, K); it overrides the record's key mask.
        """
        rows = AttentionRows.of(record, eligible)
        if rows.weights.shape[0] == 0 or rows.weights.shape[2] == 0:
            return
        metrics = self.rows_metrics(rows)
        self.stats.add_parts(rows.site, rows.kind, [(metrics, rows.step_offset)])
        if self.example_rows is not None:
            for name, (values, defined) in metrics.items():
                self._add_example_rows(rows, name, values, defined)
        self._done(rows)

    def update_parts(self, parts: Sequence[AttentionRows]) -> None:
        """Fold several batches of one site's rows in, in order, with the state
        :meth:`update` on each in turn gives; their statistics are folded together
        (:meth:`~attnaudit.analysis.stats.RowStats.add_parts`) where the analyser keeps no
        per-example rows and does not override :meth:`update`."""
        if self.example_rows is not None or type(self).update is not Analyser.update:
            for part in parts:
                self.update(part)
            return
        rows = [AttentionRows.of(part) for part in parts]
        rows = [r for r in rows if r.weights.shape[0] and r.weights.shape[2]]
        if rows:
            self.stats.add_parts(rows[0].site, rows[0].kind,
                                 [(self.rows_metrics(r), r.step_offset) for r in rows])

    def rows_metrics(self, rows: AttentionRows
                     ) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
        """metric name -> (per-row values (B, H, Q), rows where defined or None)."""
        raise NotImplementedError

    def _add(self, rows: AttentionRows, name: str, values: torch.Tensor,
             defined: torch.Tensor | None) -> None:
        """Fold one metric's per-row values (B, H, Q) of ``rows`` into the state."""
        self.stats.add(rows.site, rows.kind, name, values, defined, rows.step_offset)
        self._add_example_rows(rows, name, values, defined)

    def _add_example_rows(self, rows: AttentionRows, name: str, values: torch.Tensor,
                          defined: torch.Tensor | None) -> None:
        """Keep one metric's per-row values (B, H, Q) per example, if asked to."""
        if self.example_rows is not None:
            self.example_rows.add(rows.site, rows.kind, name, values,
                                  torch.ones((), dtype=torch.bool) if defined is None
                                  else defined, rows.step_offset)

    def _done(self, rows: AttentionRows) -> None:
        """Close one update of ``rows.site``: the next one holds new examples."""
        if self.example_rows is not None:
            self.example_rows.advance(rows.site, rows.weights.shape[0])

    def compute(self) -> pd.DataFrame:
        return self.stats.frame()

    def examples(self) -> pd.DataFrame:
        """Per-example rows: example, site, kind, layer, head, step, metric, value.

        Only finite values of rows where the metric is defined (those counted in ``n``).
        Examples are numbered per site in arrival order (see
        :mod:`attnaudit.analysis.per_example`). Needs ``per_example=True``.
        """
        if self.example_rows is None:
            raise AnalysisError(f"{type(self).__name__} keeps no per-example rows: construct it "
                                f"with {type(self).__name__}(per_example=True)")
        return self.example_rows.frame()

    def merge(self, other: Self) -> Self:
        if type(other) is not type(self):
            raise TypeError(f"cannot merge {type(other).__name__} into {type(self).__name__}")
        if (self.example_rows is None) != (other.example_rows is None):
            raise AnalysisError("cannot merge an analyser with per-example rows and one without")
        self.stats.merge(other.stats)
        if self.example_rows is not None and other.example_rows is not None:
            self.example_rows.merge(other.example_rows)
        return self

    def reset(self) -> None:
        self.stats.reset()
        if self.example_rows is not None:
            self.example_rows.reset()
