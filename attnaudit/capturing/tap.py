"""``attnaudit.tap``: one line in code you own makes its attention capturable."""

from __future__ import annotations

import sys

import torch

from attnaudit.capturing.state import ACTIVE, refuse_tracing
from attnaudit.record import Kind


def tap(name: str, weights: torch.Tensor, key_mask: torch.Tensor | None = None, *,
        kind: Kind | None = None) -> torch.Tensor:
    """Expose attention ``weights`` (keys on the last axis) as site ``name``.

    ``(batch, heads, queries, keys)`` is read as such; fewer axes, or heads folded into the
    batch, are read like any other call (names at the call site, ``capture(heads=...)``).

    Returns ``weights`` unchanged when no capture is active (one attribute read), else what
    the capture's edit returns. ``key_mask`` is bool, broadcastable to ``weights``, True
    where a key is eligible. Use the result in place of ``weights``::

        weights = attnaudit.tap("decoder.cross", torch.softmax(scores, -1), key_mask=valid)
    """
    cap = ACTIVE.capture
    if cap is None or cap.busy:  # busy: inside an edit or another site's computation
        return weights
    refuse_tracing()
    frame = sys._getframe(1)
    return cap.on_tap(name, weights, key_mask, kind, lambda: frame.f_locals)
