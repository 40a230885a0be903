"""The runs an example map averages a long axis into, written from their definition in
``attnaudit.analysis.example_maps`` (not from its formula): ``n`` positions in
``k = min(512, n)`` runs, run ``b`` holding the positions ``i`` with
``b * n / k <= i < (b + 1) * n / k``. A key axis past 512 positions is cut instead into
blocks of ``2 ** j`` consecutive keys, ``j`` the least giving at most 128 blocks
(``attnaudit.analysis.long_keys``)."""

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


def key_runs(n: int) -> list[np.ndarray]:
    """The positions of each cell of a key axis of ``n`` keys, in order."""
    if n <= MAX_MAP_SIDE:
        return runs(n)
    size = next(2 ** j for j in range(32) if len(range(0, n, 2 ** j)) <= 128)
    return [np.arange(start, min(start + size, n)) for start in range(0, n, size)]


def key_pooled(array: np.ndarray, axis: int, n: int) -> np.ndarray:
    """``array`` with its key ``axis`` of ``n`` positions averaged over :func:`key_runs`."""
    return np.stack([array.take(r, axis=axis).mean(axis=axis) for r in key_runs(n)],
                    axis=axis)
