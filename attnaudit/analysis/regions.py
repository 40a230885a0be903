"""Where the mass goes: attention inside an expected key set (docs/metrics.md, "Where the
mass goes").

region_mass = sum of the weights on the expected keys of a row (only keys that are also
eligible count; the weights are not renormalised). top_weight_hit = 1 when the row's argmax
over its eligible keys is an expected key, else 0; ties go to the lowest key index (as
``torch.argmax``), so its mean over rows is the share of rows whose top key is expected.

Only the query rows selected by ``rows`` are counted (their count is ``n`` in the frame).
Rows with a non-finite weight, or with no eligible key, have no defined value and are left
out (the numerics analyser counts them). Per-head results come from the record as is; for
"averaged over heads" feed :func:`mean_over_heads` of the record to the same analyser (its
site name gets the suffix ``:head_mean``, so both live side by side).

Example (date model: the first four emitted characters should read the source year)::

    expected = expected_from_spans([char_offsets(s) for s in sources],
                                   [[(len(s) - 4, len(s))] for s in sources], n_keys)
    analyser = RegionAnalyser()
    analyser.update(record, expected=expected, rows=4)
    analyser.compute()   # site x head x step x metric, with n, mean, quantiles
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from numbers import Integral
from typing import NoReturn

import torch

from attnaudit.analysis.base import Analyser, AttentionRows, as_4d
from attnaudit.analysis.stats import MetricSpec
from attnaudit.errors import AnalysisError
from attnaudit.record import AttentionRecord

HEAD_MEAN_SUFFIX = ":head_mean"

RowSelection = int | Sequence[int] | torch.Tensor | None


class RegionAnalyser(Analyser):
    """region_mass and top_weight_hit per site x head x query step.

    Call :meth:`update` once per batch with that batch's ``expected`` key set; merge shards
    with :meth:`merge`; read the tidy frame with :meth:`compute`.
    """

    metrics = (MetricSpec("region_mass", 0.0, 1.0), MetricSpec("top_weight_hit", 0.0, 1.0))

    def update(self, record: AttentionRecord | AttentionRows, *,  # type: ignore[override]
               expected: torch.Tensor, rows: RowSelection = None,
               eligible: torch.Tensor | None = None) -> None:
        """Fold one batch in.

        Args:
            record: an attention record or :class:`AttentionRows`; weights (B, H, Q, K).
            expected: bool, True on expected keys. Shapes by rank: (K,) the same keys for
                every row; (B, K) per example; (B, Q, K) per example and query row;
                (B, H, Q, K) in full. Size-1 axes broadcast.
            rows: query rows that count: None = all; an int n = the first n (all when
                n >= Q); a sequence of query indices in [0, Q); or a bool tensor
                broadcastable to (B, Q), True where a row counts. Indices refer to the query
                axis of ``record`` as passed (its step ``step_offset + index`` in the frame).
            eligible: bool key rule broadcastable to (B, H, Q, K), overriding the record's
                key mask (e.g. to leave out special tokens).
        """
        data = AttentionRows.of(record, eligible)
        shape = tuple(data.weights.shape)
        region = expected_4d(data.site, expected, shape).to(data.weights.device)
        selected = select_rows(data.site, rows, shape[0], shape[2]).to(data.weights.device)
        if shape[0] == 0 or shape[2] == 0:
            return
        for name, (values, defined) in self._metrics(data, region).items():
            self._add(data, name, values, defined & selected[:, None, :])
        self._done(data)

    def rows_metrics(self, rows: AttentionRows) -> NoReturn:
        raise TypeError("RegionAnalyser needs an expected key set: call "
                        "update(record, expected=..., rows=...)")

    @staticmethod
    def _metrics(data: AttentionRows, region: torch.Tensor
                 ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Per-row values (B, H, Q) and where they are defined, for a region (B, H, Q, K)."""
        w, eligible = data.weights, data.eligible
        defined = data.finite & eligible.any(-1)
        safe = torch.where(defined[..., None], w, 0.0)
        mass = (safe * (region & eligible)).sum(-1)
        top = safe.masked_fill(~eligible, float("-inf")).argmax(-1, keepdim=True)
        hit = region.expand(w.shape).gather(-1, top).squeeze(-1).to(torch.float64)
        return {"region_mass": (mass, defined), "top_weight_hit": (hit, defined)}


def expected_4d(site: str, expected: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """``expected`` as a bool view broadcast to ``shape`` = (B, H, Q, K); see RegionAnalyser."""
    if not isinstance(expected, torch.Tensor) or expected.dtype != torch.bool:
        got = expected.dtype if isinstance(expected, torch.Tensor) else type(expected).__name__
        raise AnalysisError(f"site {site!r}: expected must be a bool tensor (True = expected "
                            f"key), got {got}")
    return as_4d(site, expected, shape, "expected")


def select_rows(site: str, rows: RowSelection, batch: int, queries: int) -> torch.Tensor:
    """Bool (B, Q): the query rows that count; see :meth:`RegionAnalyser.update`."""
    if rows is None:
        return torch.ones(batch, queries, dtype=torch.bool)
    if isinstance(rows, torch.Tensor) and rows.dtype == torch.bool:
        try:
            return rows.cpu().expand(batch, queries)
        except RuntimeError:
            raise AnalysisError(f"site {site!r}: rows mask of shape {tuple(rows.shape)} does not "
                                f"broadcast to (batch, queries) = ({batch}, {queries})") from None
    if isinstance(rows, bool):
        raise AnalysisError(f"site {site!r}: rows must be None, an int, indices or a bool "
                            "tensor, not a bool")
    if isinstance(rows, int):
        if rows < 0:
            raise AnalysisError(f"site {site!r}: rows={rows}: the number of leading query "
                                "steps must be >= 0")
        mask = torch.zeros(batch, queries, dtype=torch.bool)
        mask[:, :rows] = True
        return mask
    index = rows.tolist() if isinstance(rows, torch.Tensor) else list(rows)
    if any(isinstance(i, bool) or not isinstance(i, Integral) for i in index):
        raise AnalysisError(f"site {site!r}: rows must be int query indices (for a per-row "
                            "mask pass a bool tensor)")
    bad = [i for i in index if not 0 <= i < queries]
    if bad:
        raise AnalysisError(f"site {site!r}: query indices {bad} outside [0, {queries})")
    mask = torch.zeros(batch, queries, dtype=torch.bool)
    mask[:, [int(i) for i in index]] = True
    return mask


def mean_over_heads(record_or_rows: AttentionRecord | AttentionRows,
                    eligible: torch.Tensor | None = None,
                    suffix: str = HEAD_MEAN_SUFFIX) -> AttentionRows:
    """The head average as :class:`AttentionRows` with one head: weights (B, 1, Q, K).

    Eligibility must be the same for every head (true of key masks that broadcast over
    heads, the usual case); otherwise the average would mix rows under different key rules
    and a ValueError is raised. The site is renamed ``site + suffix`` (default
    ``":head_mean"``) so per-head and averaged rows can share one analyser; the layer read
    from the name is unchanged. A row with a non-finite weight in any head is non-finite in
    the average.
    """
    data = AttentionRows.of(record_or_rows, eligible)
    weights = data.weights.mean(1, keepdim=True)
    first = data.eligible[:, :1]
    if not bool((data.eligible == first).all()):
        raise AnalysisError(f"site {data.site!r}: the key eligibility differs between heads; "
                            "average heads only under one key rule")
    sink = None if data.sink is None else data.sink.mean(1, keepdim=True)
    # the mean of a head whose view underflowed to zero sums below one: the least share
    share = None if data.share is None else data.share.amin(1, keepdim=True)
    return replace(data, site=data.site + suffix, weights=weights, eligible=first, sink=sink,
                   share=share)
