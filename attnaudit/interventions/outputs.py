"""How much an output distribution changed: TVD, JSD and argmax flips (docs/metrics.md).

Every function takes probability tensors ``p`` and ``q`` of shape ``(..., V)`` (the last
axis is the output vocabulary) and returns one value per leading index, shape ``(...)``.
Natural logarithms; distributions are smoothed with ``EPS`` before a log. JSD is computed
in float32 or wider whatever the input dtype (in float16 the smoothing would round to 0 and
a probability of exactly 0 would give NaN). ``median`` is the usual median: for an even
count, the mean of the two middle values (``torch.median`` returns the lower one).
"""

from __future__ import annotations

import torch

from attnaudit.errors import InterventionError

EPS = 1e-10


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
    return 0.5 * (p - q).abs().sum(-1)


def _kl(p: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return (p * (torch.log(p + EPS) - torch.log(m + EPS))).sum(-1)


def jsd(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Jensen-Shannon divergence 1/2 KL(p||m) + 1/2 KL(q||m), m = (p + q) / 2; in [0, ln 2].

    Computed in float32, or in the inputs' dtype when wider (float64).
    """
    _check(p, q)
    wide = torch.promote_types(torch.promote_types(p.dtype, q.dtype), torch.float32)
    p, q = p.to(wide), q.to(wide)
    m = 0.5 * (p + q)
    return (0.5 * _kl(p, m) + 0.5 * _kl(q, m)).clamp_min(0.0)


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
