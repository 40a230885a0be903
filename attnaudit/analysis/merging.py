"""Analysers merged across processes: every rank's state folded into each rank's analyser.

Two analysers of one type merge by adding their states (:meth:`Analyser.merge`). Across
processes the streaming statistics (sums, counts, minima, maxima, histograms: float64
arrays over (heads, steps[, bins])) are all-reduced, and whatever else an analyser holds
(site kinds, counters) is gathered as an object without its statistics and folded in
with the analyser's own ``merge``. How the arrays and objects travel (the process group,
its device, what a failed collective raises) is the caller's: :class:`Collectives`, which
:class:`attnaudit.runtime.distributed.Shard` implements.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

import numpy as np

from attnaudit.analysis.base import Analyser
from attnaudit.analysis.stats import Cells, RowStats
from attnaudit.errors import AnalysisError

ReduceOp = Literal["sum", "min", "max"]


class Collectives(Protocol):
    """The collectives merging needs, over one group of processes."""

    @property
    def rank(self) -> int:
        """This process's rank in the group."""
        ...

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order, on every rank."""
        ...

    def all_reduce(self, array: np.ndarray, op: ReduceOp) -> np.ndarray:
        """``array`` (float64, the same shape on every rank) combined element-wise over
        the ranks by ``op``, on every rank."""
        ...


def merge_analyser(analyser: Analyser, collectives: Collectives) -> None:
    """Merge every rank's state of ``analyser`` into it, on every rank: the streaming
    statistics by all-reduce, anything else the analyser holds (kinds, counters) by
    gathering it without its statistics and folding it in with its own ``merge``.

    Every rank calls it for the same analysers in the same order.

    Raises:
        ValueError: the analyser keeps per-example rows (numbered by arrival, so they
            cannot be merged across ranks), or a site has different head counts on two
            ranks.
    """
    if analyser.example_rows is not None:
        raise AnalysisError("per-example rows are numbered by arrival and cannot be merged "
                            "across ranks; use per_example=False")
    _all_reduce_stats(analyser.stats, collectives)
    shell = _without_stats(analyser)
    for rank, other in enumerate(collectives.all_gather(shell)):
        if rank != collectives.rank:
            analyser.merge(other)


def _all_reduce_stats(stats: RowStats, collectives: Collectives) -> None:
    """Replace every rank's cells by their sum (counts, totals, histograms), minimum and
    maximum over the ranks; a (site, metric) some rank has not seen counts as empty there,
    and the step axis grows to the longest any rank saw."""
    shapes = {key: cells.n.shape for key, cells in stats.cells.items()}
    merged: dict[tuple[str, str], tuple[int, int]] = {}
    for theirs in collectives.all_gather(shapes):
        for key, (heads, steps) in theirs.items():
            known = merged.setdefault(key, (heads, steps))
            if known[0] != heads:
                raise AnalysisError(f"cannot merge site {key[0]!r}: {known[0]} heads on one "
                                    f"rank, {heads} on another")
            merged[key] = (heads, max(known[1], steps))
    for key in sorted(merged):
        heads, steps = merged[key]
        cells = (stats.cells.get(key) or Cells.empty(heads, 0)).grown(steps)
        hist = cells.histogram()
        sums = collectives.all_reduce(np.concatenate([cells.n.ravel(), cells.total.ravel(),
                                                      hist.ravel()]), "sum")
        size = heads * steps
        stats.cells[key] = Cells(
            n=sums[:size].reshape(heads, steps),
            total=sums[size:2 * size].reshape(heads, steps),
            minimum=collectives.all_reduce(cells.minimum, "min"),
            maximum=collectives.all_reduce(cells.maximum, "max"),
            counted=sums[2 * size:].reshape(hist.shape))


def _without_stats(analyser: Analyser) -> Analyser:
    """A shallow copy of ``analyser`` whose statistics hold only the site kinds."""
    shell = object.__new__(type(analyser))
    shell.__dict__.update(analyser.__dict__)
    shell.stats = RowStats(tuple(analyser.stats.specs.values()))
    shell.stats.kinds.update(analyser.stats.kinds)
    return shell
