"""Pre-softmax score ranges and attention output norms (the checklist's "score ranges ...
and output norms"), from records captured with ``capture(..., scores=True, values=True)``.

Per row (batch, head, query), in float64:

score_min / score_max / score_mean
    over the finite scores of eligible keys (raw logits, whatever scale the model uses);
    defined for rows with at least one. The masking fill never enters these.
score_non_finite
    count of NaN / +-inf scores on eligible keys (0 in a healthy model: a key the
    declared rule allows but the model masked with -inf shows up here).
masked_score_min / masked_score_max
    over the finite scores of ineligible keys — the fill value a model uses for masking
    (-1e9, ``finfo.min``; 0 would leak mass); defined for rows with at least one.
masked_score_non_finite
    count of NaN / +-inf scores on ineligible keys (an ``-inf`` fill counts here).
output_norm
    ||sum_j w_j v_j||_2: the L2 norm of the row's attention output (context vector) from
    the weights as the model used them (every key, eligible or not) and the values
    ``(batch, heads, keys, d_v)``; defined where it is finite.

A record captured without scores (or values, or where the mechanism does not expose them:
the softmax adapter never sees values) simply has no score (output) metrics; nothing is
filled with NaN. :meth:`ScoreAnalyser.unavailable` names the sites and inputs that were
missing. An :class:`~attnaudit.record.AttentionRecord` is read call by call (each call's own
scores, values and key mask; its rows at their stacked query steps), so the ``-inf`` that
stacking puts on keys a call never saw is not reported as a masking fill, and values are
those of the call that used them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Self

import pandas as pd
import torch

from attnaudit.analysis.base import Analyser, AttentionRows, as_4d
from attnaudit.analysis.stats import MetricSpec, layer_of
from attnaudit.errors import AnalysisError
from attnaudit.record import AttentionRecord

INPUTS = ("scores", "values")
SCORE_METRICS = ("score_min", "score_max", "score_mean", "score_non_finite",
                 "masked_score_min", "masked_score_max", "masked_score_non_finite")
OUTPUT_METRICS = ("output_norm",)

Part = tuple[AttentionRows, torch.Tensor | None, torch.Tensor | None]


class ScoreAnalyser(Analyser):
    """Score ranges and output norms per site x head x query step (see the module doc).

    ``update(record)`` reads the record's scores and values; for :class:`AttentionRows` (which
    carry neither) pass them as ``scores=`` (B, H, Q, K) and ``values=`` (B, H or 1, K, d_v).
    """

    metrics = (
        MetricSpec("score_min", -32.0, 32.0),
        MetricSpec("score_max", -32.0, 32.0),
        MetricSpec("score_mean", -32.0, 32.0),
        MetricSpec("score_non_finite", 0.0, 256.0),
        MetricSpec("masked_score_min", -1e9, 0.0),
        MetricSpec("masked_score_max", -1e9, 0.0),
        MetricSpec("masked_score_non_finite", 0.0, 256.0),
        MetricSpec("output_norm", 0.0, 64.0),
    )

    def __init__(self, per_example: bool = False) -> None:
        super().__init__(per_example)
        self.missing: dict[tuple[str, str], int] = {}  # (site, input) -> updates without it
        self.missing_kinds: dict[str, str | None] = {}

    def update(self, record: AttentionRecord | AttentionRows, *,
               eligible: torch.Tensor | None = None, scores: torch.Tensor | None = None,
               values: torch.Tensor | None = None) -> None:
        """Fold one batch in.

        Args:
            record: an attention record (read call by call) or :class:`AttentionRows`.
            eligible: declared key rule, as for every analyser; overrides the key mask.
            scores: pre-softmax scores (B, H, Q, K), overriding the record's.
            values: values (B, H, K, d_v) (H may be 1, or divide the weights' heads as in
                grouped-query attention), overriding the record's.
        """
        parts = list(_parts(record, eligible, scores, values))
        if not parts:
            return
        lacking: set[str] = set()
        for rows, part_scores, part_values in parts:
            if part_scores is None:
                lacking.add("scores")
            else:
                for name, (vals, defined) in _score_metrics(rows, part_scores).items():
                    self._add(rows, name, vals, defined)
            if part_values is None:
                lacking.add("values")
            else:
                self._add(rows, "output_norm", _output_norm(rows, part_values), None)
        first = parts[0][0]
        for what in sorted(lacking):
            key = (first.site, what)
            self.missing[key] = self.missing.get(key, 0) + 1
            self.missing_kinds.setdefault(first.site, first.kind)
        self._done(first)

    def unavailable(self) -> pd.DataFrame:
        """Sites whose scores or values were missing, so their metrics are absent.

        One row per site x input: ``site``, ``kind``, ``layer``, ``input`` ("scores" or
        "values") and ``updates``, the number of updates (batches) that lacked it. Empty
        when every update had both.
        """
        rows = [{"site": site, "kind": self.missing_kinds.get(site), "layer": layer_of(site),
                 "input": what, "updates": count}
                for (site, what), count in sorted(self.missing.items())]
        frame = pd.DataFrame(rows, columns=["site", "kind", "layer", "input", "updates"])
        frame["layer"] = frame["layer"].astype("Int64")
        return frame

    def merge(self, other: Self) -> Self:
        super().merge(other)
        for key, count in other.missing.items():
            self.missing[key] = self.missing.get(key, 0) + count
        for site, kind in other.missing_kinds.items():
            self.missing_kinds.setdefault(site, kind)
        return self

    def reset(self) -> None:
        super().reset()
        self.missing.clear()
        self.missing_kinds.clear()


def _parts(record: AttentionRecord | AttentionRows, eligible: torch.Tensor | None,
           scores: torch.Tensor | None, values: torch.Tensor | None) -> Iterator[Part]:
    """(rows, scores, values) per piece of ``record`` that holds rows."""
    if isinstance(record, AttentionRecord) and scores is None and values is None:
        declared = None if eligible is None else AttentionRows.of(record, eligible).eligible
        offsets = itertools.accumulate((c.weights.shape[2] for c in record.calls), initial=0)
        for call, offset in zip(record.calls, offsets, strict=False):
            q, k = call.weights.shape[2:] if call.weights.ndim == 4 else (0, 0)
            mask = (call.key_mask if declared is None
                    else declared[:, :, offset : offset + q, :k])
            rows = AttentionRows.of(AttentionRows(record.name, record.kind, call.weights,
                                torch.ones(1, dtype=torch.bool) if mask is None else mask,
                                offset))
            if rows.weights.shape[0] and rows.weights.shape[2]:
                yield rows, call.scores, call.values
        return
    rows = AttentionRows.of(record, eligible)
    if rows.weights.shape[0] and rows.weights.shape[2]:
        yield (rows, getattr(record, "scores", None) if scores is None else scores,
               getattr(record, "values", None) if values is None else values)


def _score_metrics(rows: AttentionRows, scores: torch.Tensor
                   ) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
    """Per-row score metrics (B, H, Q) and where they are defined."""
    if not isinstance(scores, torch.Tensor) or not scores.is_floating_point():
        raise AnalysisError(f"site {rows.site!r}: scores must be a floating-point tensor")
    s = as_4d(rows.site, scores.detach().to(rows.weights.device, torch.float64),
              tuple(rows.weights.shape), "scores")
    finite = torch.isfinite(s)
    eligible = rows.eligible
    out: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}
    for prefix, keys in (("score", eligible), ("masked_score", ~eligible)):
        kept = keys & finite
        count = kept.sum(-1)
        some = count > 0
        out[f"{prefix}_min"] = (s.masked_fill(~kept, float("inf")).amin(-1), some)
        out[f"{prefix}_max"] = (s.masked_fill(~kept, float("-inf")).amax(-1), some)
        if prefix == "score":
            out["score_mean"] = (s.where(kept, 0.0).sum(-1) / count.clamp_min(1), some)
        out[f"{prefix}_non_finite"] = ((keys & ~finite).sum(-1).to(torch.float64), None)
    return out


def _output_norm(rows: AttentionRows, values: torch.Tensor) -> torch.Tensor:
    """||weights @ values||_2 per row (B, H, Q); values (B or 1, H or a divisor, K, d_v)."""
    site, (batch, heads, _, keys) = rows.site, rows.weights.shape
    if (not isinstance(values, torch.Tensor) or not values.is_floating_point()
            or values.ndim != 4):
        got = tuple(values.shape) if isinstance(values, torch.Tensor) else type(values).__name__
        raise AnalysisError(f"site {site!r}: values must be a floating-point tensor "
                            f"(batch, heads, keys, d_v), got {got}")
    v_batch, v_heads, v_keys, _ = values.shape
    if v_batch not in (batch, 1) or v_keys != keys or heads % v_heads:
        raise AnalysisError(
            f"site {site!r}: values of shape {tuple(values.shape)} (batch, heads, keys, d_v) "
            f"do not fit weights of shape {tuple(rows.weights.shape)} (batch, heads, queries, "
            "keys): batch must match (or be 1), keys must match, and the value heads must "
            "divide the query heads")
    v = values.detach().to(rows.weights.device, torch.float64)
    # grouped-query attention: each value head serves heads // v_heads consecutive heads
    v = v.repeat_interleave(heads // v_heads, dim=1).expand(batch, heads, keys, -1)
    return torch.linalg.vector_norm(torch.matmul(rows.weights, v), dim=-1)
