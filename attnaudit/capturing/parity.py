"""Backend parity: the deployed fused kernel's output against capture's explicit ``P·V``.

Where capture computes an ``F.scaled_dot_product_attention`` call explicitly, the weights it
records are its own computation, not the fused kernel users run. On the first
:data:`PARITY_CALLS_PER_SITE` calls at each site of a capture, the SDPA adapter also runs the
function that was ``F.scaled_dot_product_attention`` when the capture began (the deployed
kernel) on the same arguments and keeps the gap here: the largest absolute difference between
the two outputs and that difference relative to the explicit output's largest magnitude. A
kernel that ignores the model's scaling or handles the mask differently shows up as a gap
while the recorded weights look healthy. Calls that an edit changed or that use dropout are
not compared (their outputs differ by design). Only captures run inside :func:`sampled` (the
validity audit's passes) compare at all, so the many captures of an intervention run pay
nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from weakref import WeakKeyDictionary

import torch

# Calls compared per site and capture: one fused call each, so a check costs little more.
PARITY_CALLS_PER_SITE = 2


@dataclass
class ParityGap:
    """What the compared calls at one site showed: ``calls`` compared, ``gap`` the largest
    |fused - explicit| over their outputs, ``relative`` the largest of each call's gap over
    its explicit output's largest magnitude, ``dtype`` the calls' query dtype."""

    calls: int
    gap: float
    relative: float
    dtype: str

    def merged(self, other: ParityGap) -> ParityGap:
        return ParityGap(self.calls + other.calls, max(self.gap, other.gap),
                         max(self.relative, other.relative), other.dtype)


# Per capture (weakly, dropped with it): site name -> its gap so far.
_GAPS: WeakKeyDictionary[object, dict[str, ParityGap]] = WeakKeyDictionary()


class _Sampling:
    on = False


_SAMPLING = _Sampling()


@contextmanager
def sampled() -> Iterator[None]:
    """Captures inside compare their first calls per site with the deployed kernel."""
    was, _SAMPLING.on = _SAMPLING.on, True
    try:
        yield
    finally:
        _SAMPLING.on = was


def wants_sample(cap: object, site: str) -> bool:
    """Whether the next call at ``site`` in ``cap`` is compared with the fused kernel."""
    if not _SAMPLING.on:
        return False
    known = _GAPS.get(cap, {}).get(site)
    return known is None or known.calls < PARITY_CALLS_PER_SITE


def measure(cap: object, site: str, fused: torch.Tensor, explicit: torch.Tensor) -> None:
    """Keep the gap between one call's ``fused`` and ``explicit`` outputs (same shape)."""
    gap = scale = 0.0
    if explicit.numel():  # the largest magnitudes from each one's extremes: 3 passes, 1 wait
        wide = explicit.detach().float()
        extremes = torch.stack([*torch.aminmax(fused.detach().float() - wide),
                                *torch.aminmax(wide)]).abs().tolist()
        gap, scale = max(extremes[:2]), max(extremes[2:])
    relative = gap / scale if scale > 0 else (0.0 if gap == 0 else float("inf"))
    if gap != gap:  # NaN in one output but not the other
        gap = relative = float("inf")
    new = ParityGap(1, gap, relative, str(explicit.dtype).removeprefix("torch."))
    gaps = _GAPS.setdefault(cap, {})
    gaps[site] = gaps[site].merged(new) if site in gaps else new


def parity_of(cap: object) -> dict[str, ParityGap]:
    """Site name -> the gap of its compared calls in ``cap`` (empty: none compared)."""
    return dict(_GAPS.get(cap, {}))
