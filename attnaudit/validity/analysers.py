"""The analysers every validity check reads, fed together, and the tolerances they count at.

Besides the docs/metrics.md names, the metrics table carries, per row: ``masked_rows``
(masked_mass over the masked-mass tolerance), ``row_sum_rows`` (row_sum_error over the
row-sum tolerance), ``non_finite_rows`` and ``negative_rows`` (rows with any NaN/inf or
negative weight); their ``sum`` is a row count. A "row" is one (example, head, query
step).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pandas as pd
import torch

from attnaudit.analysis import (
    Analyser,
    EntropyAnalyser,
    MaskingAnalyser,
    NumericsAnalyser,
    masking,
)
from attnaudit.analysis.numerics import row_sum_tolerance
from attnaudit.analysis.scores import ScoreAnalyser
from attnaudit.errors import AnalysisError
from attnaudit.record import AttentionRecord
from attnaudit.validity.rules import declared_rows

DEFAULT_MAX_MASKED_MASS = masking.DEFAULT_TOLERANCE
DEFAULT_ROW_SUM_TOLERANCE = None  # the dtype rule of numerics.row_sum_tolerance


class ValidityAnalysers:
    """The analysers every validity check reads, fed together: entropy, masking, numerics
    (with the gate's row counts) and score ranges.

    ``update(record, eligible=..., rows=...)``: ``eligible`` declares the key rule (bool,
    read by rank as in :meth:`attnaudit.analysis.Analyser.update`), combined with the
    record's own key mask (see :func:`~attnaudit.validity.rules.declared_rows`); ``rows``
    (bool (B, Q), None = all) picks the query rows that count; ``step_offset``: the step
    of the record's first query row (a call analysed as it arrives).
    """

    def __init__(self, max_masked_mass: float = DEFAULT_MAX_MASKED_MASS,
                 row_sum_tolerance: float | None = DEFAULT_ROW_SUM_TOLERANCE, *,
                 checks_only: bool = False) -> None:
        self.max_masked_mass = max_masked_mass
        self.row_sum_tolerance = row_sum_tolerance
        self.row_analysers: list[Analyser] = [MaskingAnalyser(max_masked_mass),
                                              NumericsAnalyser(row_sum_tolerance)]
        if not checks_only:
            self.row_analysers.insert(0, EntropyAnalyser())
        self.scores = None if checks_only else ScoreAnalyser()
        # site -> the largest row-sum tolerance its rows were counted at
        self.site_row_sum_tolerance: dict[str, float] = {}

    @property
    def all(self) -> list[Analyser]:
        """Every analyser fed (the row analysers, then the score analyser if any)."""
        return [*self.row_analysers, *([] if self.scores is None else [self.scores])]

    def update(self, record: AttentionRecord, *, eligible: torch.Tensor | None = None,
               rows: torch.Tensor | None = None, step_offset: int = 0) -> None:
        data = replace(declared_rows(record, eligible), step_offset=step_offset)
        used = (row_sum_tolerance(data.dtype, data.weights.shape[-1])
                if self.row_sum_tolerance is None else self.row_sum_tolerance)
        known = self.site_row_sum_tolerance.get(data.site, used)
        self.site_row_sum_tolerance[data.site] = max(known, used)
        scores = record.scores
        values = shared_values(record)
        batch, _, queries, _ = data.weights.shape
        parts = []
        for examples, start, stop in row_groups(data.site, rows, batch, queries):
            part = replace(data, weights=data.weights[examples, :, start:stop],
                           eligible=data.eligible[examples, :, start:stop],
                           step_offset=data.step_offset + start,
                           sink=None if data.sink is None
                           else data.sink[examples, :, start:stop],
                           share=None if data.share is None
                           else data.share[examples, :, start:stop])
            parts.append(part)
            if self.scores is None:
                continue
            self.scores.update(
                part, scores=None if scores is None else scores[examples, :, start:stop],
                values=None if values is None else values[examples % values.shape[0]])
        for analyser in self.row_analysers:  # each group's rows, folded together
            analyser.update_parts(parts)

    def merge_tolerances(self, other: dict[str, float]) -> None:
        """Fold in another shard's per-site row-sum tolerances (the largest is kept)."""
        for name, used in other.items():
            self.site_row_sum_tolerance[name] = max(self.site_row_sum_tolerance.get(name, used),
                                                    used)

    def metrics(self) -> pd.DataFrame:
        frames = [a.compute() for a in self.all]
        frames = [f for f in frames if not f.empty]
        if not frames:
            return self.row_analysers[0].compute()
        return pd.concat(frames, ignore_index=True)


def shared_values(record: AttentionRecord) -> torch.Tensor | None:
    """The record's values when every call used them: one call, or the query blocks of one
    (which share the values' storage); a stacked record keeps only its last call's."""
    last = record.values
    if last is None or any(not same_tensor(c.values, last) for c in record.calls):
        return None
    return last


def same_tensor(a: torch.Tensor | None, b: torch.Tensor) -> bool:
    """``a`` is ``b`` or a view of the same memory with the same shape (a detached copy)."""
    return a is not None and (a is b or (a.data_ptr() == b.data_ptr()
                                          and a.shape == b.shape and a.stride() == b.stride()))


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
        raise AnalysisError(f"site {site!r}: row selection of shape {tuple(selected.shape)} "
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
    if not steps:
        return
    start = prev = steps[0]
    for s in steps[1:]:
        if s != prev + 1:
            yield start, prev + 1
            start = s
        prev = s
    yield start, prev + 1
