"""The runs an example map averages a long axis into, written from their definition in
``attnaudit.analysis.example_maps`` (not from its formula): ``n`` positions in
``k = min(512, n)`` runs, run ``b`` holding the positions ``i`` with
``b * n / k <= i < (b + 1) * n / k``."""

from __future__ import annotations

import numpy as np

from attnaudit.analysis.example_maps import MAX_MAP_SIDE


def runs(n: int) -> list[np.ndarray]:
    """The positions of each run, in order; one run per position up to the limit."""
    k = min(MAX_MAP_SIDE, n)
    return [np.array([i for i in range(n) if b * n <= i * k < (b + 1) * n])
            for b in range(k)]


def pooled(array: np.ndarray, axis: int, n: int) -> np.ndarray:
    """``array`` with its ``axis`` of ``n`` positions averaged over :func:`runs`."""
    return np.stack([array.take(r, axis=axis).mean(axis=axis) for r in runs(n)], axis=axis)
