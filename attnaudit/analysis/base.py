"""The analyser interface: ``update`` / ``compute`` / ``merge`` / ``reset``.

An analyser folds :class:`~attnaudit.record.AttentionRecord` batches into
:class:`~attnaudit.analysis.stats.RowStats` and reports a tidy DataFrame with one row per
site x head x query step x metric and its count ``n``. Two analysers of the same type
merge by adding their states, so an audit can be sharded and combined.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar, Self

import pandas as pd
import torch

from attnaudit.analysis.stats import MetricSpec, RowStats
from attnaudit.record import AttentionRecord


@dataclass
class Rows:
    """One batch of attention rows, validated and in float64.

    weights: (batch, heads, queries, keys). eligible: bool, same shape.
    """

    site: str
    kind: str | None
    weights: torch.Tensor
    eligible: torch.Tensor
    step_offset: int = 0

    @classmethod
    def of(cls, record: AttentionRecord | Rows, eligible: torch.Tensor | None = None) -> Rows:
        """Rows from a record; ``eligible`` (bool, broadcastable) overrides its key mask."""
        name = record.site if isinstance(record, Rows) else record.name
        weights = record.weights
        if not isinstance(weights, torch.Tensor) or weights.ndim != 4:
            raise ValueError(f"site {name!r}: weights must be a 4-D tensor "
                             "(batch, heads, queries, keys)")
        if not weights.is_floating_point():
            raise ValueError(f"site {name!r}: weights must be floating point, "
                             f"got {weights.dtype}")
        if (isinstance(record, Rows) and eligible is None and weights.dtype == torch.float64
                and record.eligible.dtype == torch.bool
                and record.eligible.shape == weights.shape):
            return record  # nothing to convert or check
        weights = weights.detach().to(torch.float64)
        if isinstance(record, Rows):
            mask = record.eligible if eligible is None else eligible
            return cls(record.site, record.kind, weights,
                       _eligibility(record.site, weights, mask), record.step_offset)
        mask = record.key_mask if eligible is None else eligible
        return cls(record.name, record.kind, weights, _eligibility(record.name, weights, mask))

    @cached_property
    def n_valid(self) -> torch.Tensor:
        """Eligible keys per row (batch, heads, queries)."""
        return self.eligible.sum(-1)

    @cached_property
    def finite(self) -> torch.Tensor:
        """Bool (batch, heads, queries): every weight in the row is finite."""
        return torch.isfinite(self.weights).all(-1)

    @cached_property
    def eligible_weights(self) -> torch.Tensor:
        """Weights with ineligible keys set to 0 (batch, heads, queries, keys)."""
        return self.weights.where(self.eligible, 0.0)


def _eligibility(site: str, weights: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return torch.ones_like(weights, dtype=torch.bool)
    if mask.dtype != torch.bool:
        raise ValueError(f"site {site!r}: key mask must be bool (True = eligible), "
                         f"got {mask.dtype}")
    try:
        return mask.to(weights.device).expand(weights.shape)
    except RuntimeError:
        raise ValueError(
            f"site {site!r}: key mask of shape {tuple(mask.shape)} does not broadcast to "
            f"weights of shape {tuple(weights.shape)} (batch, heads, queries, keys)"
        ) from None


class Analyser:
    """Base class. Subclasses declare ``metrics`` and implement :meth:`rows_metrics`."""

    metrics: ClassVar[tuple[MetricSpec, ...]] = ()

    def __init__(self) -> None:
        self.stats = RowStats(self.metrics)

    def update(self, record: AttentionRecord | Rows, *,
               eligible: torch.Tensor | None = None) -> None:
        """Fold one record (or batch of rows) in. ``eligible`` declares the key rule."""
        rows = Rows.of(record, eligible)
        if rows.weights.shape[0] == 0 or rows.weights.shape[2] == 0:
            return
        for name, (values, defined) in self.rows_metrics(rows).items():
            self.stats.add(rows.site, rows.kind, name, values, defined, rows.step_offset)

    def rows_metrics(self, rows: Rows) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
        """metric name -> (per-row values (B, H, Q), rows where defined or None)."""
        raise NotImplementedError

    def compute(self) -> pd.DataFrame:
        return self.stats.frame()

    def merge(self, other: Self) -> Self:
        if type(other) is not type(self):
            raise TypeError(f"cannot merge {type(other).__name__} into {type(self).__name__}")
        self.stats.merge(other.stats)
        return self

    def reset(self) -> None:
        self.stats.reset()
