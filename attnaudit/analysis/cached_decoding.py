"""Does the model's own cached decoding compute what its one teacher-forced pass computes?

Every protocol reads attention from one teacher-forced pass over the source (or prompt) and
the decoded output. A model's ``generate()`` instead runs the source once and then one
position per step from its own cache. For most models the two are the same computation in
another order; for some they are not: a sparse-attention indexer that picks its top-k keys
from what the cache holds, a state-space or linear-attention layer whose recurrent step
differs from its chunked scan, a cache that compresses blocks of keys. There the weights the
audit shows are the one pass's, and the output was produced by other ones.

:func:`compare_cached_decoding` measures it per batch when the target offers
``cached_decode`` (:class:`~attnaudit.targets.contract.Seq2SeqTarget`): for every
(example, step) row up to and including the first end-of-sequence step, the total variation
between the output distributions of the cached step and of the teacher-forced pass, compared
with :func:`step_tolerance` for the logits' dtype. :class:`CachedDecoding` holds the largest
one and where it was, over every batch (:meth:`CachedDecoding.merged`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd
import torch

from attnaudit.capturing.blocks import DEFAULT_MAX_MEMORY
from attnaudit.errors import TargetError
from attnaudit.targets.contract import Batch, Seq2SeqTarget

NOT_OFFERED = "the target offers no cached decoding (Seq2SeqTarget.cached_decode)"


def step_tolerance(dtype: torch.dtype) -> float:
    """How far (total variation) a cached step's output may be from the teacher-forced one's
    in ``dtype``: the same computation in another order."""
    return 1e-3 if torch.finfo(dtype).bits >= 32 else 5e-2


@dataclass(frozen=True)
class CachedDecoding:
    """The cached decoding against the teacher-forced pass, over the batches measured.

    measured: whether any row was compared (False: ``reason`` says why not). rows: the
    (example, step) rows compared. differing_rows: those whose total variation exceeds
    ``tolerance``. total_variation: the largest total variation between the two output
    distributions of one row (0..1); example (index in the audit data) and step: its row.
    """

    measured: bool
    reason: str = ""
    rows: int = 0
    differing_rows: int = 0
    total_variation: float = math.nan
    example: int = -1
    step: int = -1
    tolerance: float = math.nan

    @property
    def differs(self) -> bool:
        """True when some row's cached step is beyond the tolerance."""
        return self.differing_rows > 0

    def merged(self, other: CachedDecoding) -> CachedDecoding:
        """Both measurements together: counts summed, the larger largest row kept; one not
        measured is left out (of two, the later one's reason is kept)."""
        if not self.measured:
            return other
        if not other.measured:
            return self
        worst = other if _rank(other.total_variation) > _rank(self.total_variation) else self
        return replace(worst, rows=self.rows + other.rows,
                       differing_rows=self.differing_rows + other.differing_rows,
                       tolerance=max(self.tolerance, other.tolerance))

    def sentence(self) -> str:
        """What was found, in words (the checklist's observation)."""
        if not self.measured:
            return f"Cached decoding not compared with the teacher-forced pass: {self.reason}."
        where = (f"total variation {self.total_variation:.3g} at step {self.step} of "
                 f"example {self.example}")
        if self.differs:
            return (f"The model's own cached decoding steps differ from its one "
                    f"teacher-forced pass ({where}; {self.differing_rows} of {self.rows} "
                    f"rows beyond {self.tolerance:g}): the weights shown are the one "
                    "pass's; generate() computed others.")
        return (f"The model's own cached decoding steps agree with its one teacher-forced "
                f"pass on all {self.rows} rows (largest {where}, tolerance "
                f"{self.tolerance:g}).")

    def record(self) -> dict[str, Any]:
        """JSON-ready, for the manifest."""
        if not self.measured:
            return {"measured": False, "reason": self.reason}
        return {"measured": True, "differs": self.differs, "rows": self.rows,
                "differing_rows": self.differing_rows,
                "total_variation": self.total_variation, "example": self.example,
                "step": self.step, "tolerance": self.tolerance}

    def frame(self) -> pd.DataFrame:
        """One row: :meth:`record`'s fields (a CSV evidence table)."""
        return pd.DataFrame([{"measured": False, "reason": self.reason} if not self.measured
                             else self.record()])


NOT_COMPARED = CachedDecoding(False, NOT_OFFERED)  # what an audit holds until a batch is


def compare_cached_decoding(target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor,
                            step_mask: torch.Tensor, first: int, *,
                            max_memory: int = DEFAULT_MAX_MEMORY,
                            forced: torch.Tensor | None = None) -> CachedDecoding:
    """The target's cached decoding of ``emitted`` (B, T) against its teacher-forced pass on
    ``batch``, over the rows of ``step_mask`` (B, T) bool; ``first``: the index of the
    batch's first example in the audit data; ``forced``: the teacher-forced logits
    (B, T, V) when the caller has them (else they are computed here). Not measured, with
    the reason, when the target offers no ``cached_decode`` or it fails (a TargetError,
    e.g. a model that returns no cache).

    The cached decoding's logits (b, T, V) go in chunks of ``b`` examples that hold them
    in float32 within ``max_memory`` bytes, as do the teacher-forced ones computed here
    (the first chunk is one example, whose logits give the vocabulary size): a batch of a
    58k-token vocabulary never holds a second (B, T, V) float32 copy."""
    if target.cached_decode is None:
        return NOT_COMPARED
    if not step_mask.any():
        return CachedDecoding(False, "no emitted step to compare")
    copies = 1 if forced is not None else 2  # float32 (b, T, V) copies alive per chunk
    vocab = None if forced is None else forced.shape[-1]  # else known after the first chunk
    gaps, start = [], 0
    while start < len(batch):
        rows = 1 if vocab is None else max(1, max_memory // (copies * 4 * emitted.shape[1]
                                                             * vocab))
        index = torch.arange(start, min(start + rows, len(batch)))
        try:
            with torch.no_grad():
                part = (target.teacher_forced(batch.select(index), emitted[index])
                        if forced is None else forced[index.to(forced.device)])
                gaps.append(_chunk_gap(target.cached_decode(batch.select(index),
                                                            emitted[index]), part))
        except TargetError as exc:
            return CachedDecoding(False, f"the cached decoding failed: {exc}")
        vocab, start = part.shape[-1], start + len(index)
    gap = torch.cat(gaps)  # (B, T)
    counted = step_mask.to(gap.device)
    tolerance = step_tolerance(part.dtype)
    differing = counted & ~(gap <= tolerance)  # a non-finite output differs too
    # the largest row, a non-finite one first (above any total variation); others never
    at = int(gap.nan_to_num(2.0).masked_fill(~counted, -1.0).argmax())
    example, step = divmod(at, gap.shape[1])
    return CachedDecoding(True, rows=int(counted.sum()), differing_rows=int(differing.sum()),
                          total_variation=float(gap.flatten()[at]), example=first + example,
                          step=step, tolerance=tolerance)


def _chunk_gap(cached: torch.Tensor, forced: torch.Tensor) -> torch.Tensor:
    """(b, T) total variation per step between the cached decoding's logits ``cached``
    (b, T', V), T' <= T, and the teacher-forced ones ``forced`` (b, T, V); 0 at steps the
    cached decoding did not reach (after every row had ended)."""
    gap = torch.zeros(forced.shape[:2], dtype=torch.float32, device=forced.device)
    # step by step: float32 copies of one step's (b, V) at a time, not of (b, T, V)
    for t in range(cached.shape[1]):
        gap[:, t] = logits_tvd(cached[:, t], forced[:, t])
    return gap


def logits_tvd(logits: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """(...,): total variation between the output distributions (softmax, float32) of
    logits (..., V) and ``other``, row by row."""
    return 0.5 * (torch.softmax(logits.float(), -1)
                  - torch.softmax(other.float(), -1)).abs().sum(-1)


def _rank(total_variation: float) -> float:
    """Orders rows by total variation, a non-finite one (NaN) above every other."""
    return 2.0 if math.isnan(total_variation) else total_variation
