"""How much an output distribution changed: TVD, JSD and argmax flips (docs/metrics.md).

Every function takes probability tensors ``p`` and ``q`` of shape ``(..., V)`` (the last
axis is the output vocabulary) and returns one value per leading index, shape ``(...)``.
Natural logarithms; distributions are smoothed with ``EPS`` before a log. JSD is computed
in float32 or wider whatever the input dtype (in float16 the smoothing would round to 0 and
a probability of exactly 0 would give NaN). ``median`` is the usual median: for an even
count, the mean of the two middle values (``torch.median`` returns the lower one).
``changes`` gives all three of TVD, JSD and flips at once, with the same values, for
distributions compared without gradients (an intervention's edited items).
"""

from __future__ import annotations

from itertools import pairwise

import torch

from attnaudit.errors import InterventionError

EPS = 1e-10
CPU_BLOCK_BYTES = 4 * 2**20  # rows :func:`changes` takes at once on the CPU


def _check(p: torch.Tensor, q: torch.Tensor) -> None:
    if p.shape != q.shape:
        raise InterventionError(f"output distributions differ in shape: {tuple(p.shape)} vs "
                                f"{tuple(q.shape)}; compare distributions over the same "
                                "rows and vocabulary")
    if p.ndim == 0:
        raise InterventionError("output distributions need a vocabulary axis (..., V); "
                                "pass probabilities, not a scalar")


def tvd(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Total variation distance 1/2 * sum |p - q|, in [0, 1]."""
    _check(p, q)
    return _half_sum((p - q).abs())


def _half_sum(distance: torch.Tensor) -> torch.Tensor:
    """TVD from ``distance`` = |p - q| (..., V): half its sum over the last axis."""
    return 0.5 * distance.sum(-1)


def _wide(p: torch.Tensor, q: torch.Tensor) -> torch.dtype:
    """The dtype the divergence is computed in: float32, or the inputs' when wider."""
    return torch.promote_types(torch.promote_types(p.dtype, q.dtype), torch.float32)


def _kl(p: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return (p * (torch.log(p + EPS) - torch.log(m + EPS))).sum(-1)


def jsd(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Jensen-Shannon divergence 1/2 KL(p||m) + 1/2 KL(q||m), m = (p + q) / 2; in [0, ln 2].

    Computed in float32, or in the inputs' dtype when wider (float64).
    """
    _check(p, q)
    wide = _wide(p, q)
    p, q = p.to(wide), q.to(wide)
    m = 0.5 * (p + q)
    return (0.5 * _kl(p, m) + 0.5 * _kl(q, m)).clamp_min(0.0)


def changes(p: torch.Tensor, q: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(tvd(p, q), jsd(p, q), flip(p, q))``, the same values from the same operations,
    computed in place on two temporaries instead of a dozen: over a large vocabulary the
    separate functions' passes and allocations cost more than the edited step's forward
    pass. On the CPU the rows go in blocks of :data:`CPU_BLOCK_BYTES`, whose temporaries
    stay in cache; each block has two rows or more, so each row is reduced as in one call
    over every row (a reduction to one value alone is split across threads). No gradients
    flow through it."""
    _check(p, q)
    vocab = p.shape[-1]
    if p.ndim == 1 or p.device.type != "cpu" or p.numel() == 0:
        return _changes(p, q)
    lead = p.shape[:-1]
    p, q = p.reshape(-1, vocab), q.reshape(-1, vocab)
    n = p.shape[0]
    rows = max(2, CPU_BLOCK_BYTES // max(vocab * 8, 1))
    bounds = [*range(0, n, rows), n]
    if len(bounds) > 2 and bounds[-1] - bounds[-2] == 1:
        del bounds[-2]  # no block of one row
    parts = [_changes(p[a:b], q[a:b]) for a, b in pairwise(bounds)]
    change, divergence, flipped = (torch.cat(part).reshape(lead)
                                   for part in zip(*parts, strict=True))
    return change, divergence, flipped


def _changes(p: torch.Tensor, q: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`changes` of one block of rows."""
    with torch.no_grad():
        change = _half_sum(torch.sub(p, q).abs_())
        wide = _wide(p, q)
        p, q = p.to(wide), q.to(wide)
        log_m = torch.add(p, q).mul_(0.5).add_(EPS).log_()
        smoothed = torch.add(p, EPS)
        kl_p = smoothed.log_().sub_(log_m).mul_(p).sum(-1)
        kl_q = torch.add(q, EPS, out=smoothed).log_().sub_(log_m).mul_(q).sum(-1)
        divergence = (0.5 * kl_p + 0.5 * kl_q).clamp_min(0.0)
        return change, divergence, p.argmax(-1) != q.argmax(-1)


def flip(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Bool: the argmax of the output distribution changed."""
    _check(p, q)
    return p.argmax(-1) != q.argmax(-1)


def median(x: torch.Tensor) -> torch.Tensor:
    """Median over the last axis, (..., R) -> (...): the middle value for an odd count R,
    the mean of the two middle values for an even count."""
    if x.shape[-1] == 0:
        raise ValueError("median of an empty axis")
    ordered = x.sort(-1).values
    n = ordered.shape[-1]
    return 0.5 * (ordered[..., (n - 1) // 2] + ordered[..., n // 2])
