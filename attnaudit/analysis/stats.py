"""Mergeable streaming state: per (site, metric) arrays over (heads, query steps).

State is sums, counts, min/max and a fixed-size histogram per cell (with at most a quarter
of its size in values not yet counted into it), never a list of tensors, so memory depends
on the number of sites, heads and query steps seen — not on the number of examples. Arrays
grow along the step axis when a longer query axis arrives.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from attnaudit.errors import AnalysisError

HIST_BINS = 256
QUANTILES = (0.1, 0.5, 0.9)
QUANTILE_COLUMNS = tuple(f"q{round(q * 100)}" for q in QUANTILES)
# a metric's per-row values (batch, heads, steps) and the rows where it is defined (None: all)
Metric = tuple[torch.Tensor, torch.Tensor | None]
_LAYER = re.compile(r"\.(?:layers?|block|blocks|h)\.(\d+)(?:\.|:|$)")


def layer_of(site: str) -> int | None:
    """The layer index in a site name (``model.decoder.layers.3.encoder_attn`` -> 3), or None."""
    match = _LAYER.search(site)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class MetricSpec:
    """A per-row metric and the fixed histogram range its quantiles are read from."""

    name: str
    lo: float = 0.0
    hi: float = 1.0


@dataclass
class Cells:
    """Accumulators for one (site, metric): ``n``, ``total``, ``minimum``, ``maximum`` are
    (heads, steps) float64; the histogram (heads, steps, HIST_BINS) of counts is ``counted``
    (float64, C-contiguous; None while nothing is counted into it) plus ``pending``: bin
    codes ``(step * heads + head) * HIST_BINS + bin`` not yet counted, one per value.

    Codes wait until the histogram is read (:meth:`histogram`) or until they would take a
    quarter of its size: a batch's own state (a few values per cell) then never allocates
    heads x steps x 256 floats only to add them to the audit's, and the codes keep their
    meaning when the step axis grows. Arrays in ``pending`` are never written to."""

    n: np.ndarray
    total: np.ndarray
    minimum: np.ndarray
    maximum: np.ndarray
    counted: np.ndarray | None = None
    pending: list[np.ndarray] = field(default_factory=list)

    @classmethod
    def empty(cls, heads: int, steps: int) -> Cells:
        return cls(n=np.zeros((heads, steps)), total=np.zeros((heads, steps)),
                   minimum=np.full((heads, steps), np.inf),
                   maximum=np.full((heads, steps), -np.inf))

    def copy(self) -> Cells:
        return Cells(self.n.copy(), self.total.copy(), self.minimum.copy(),
                     self.maximum.copy(), None if self.counted is None else self.counted.copy(),
                     list(self.pending))

    def grown(self, steps: int) -> Cells:
        """These cells with the step axis extended to ``steps``."""
        heads, extra = self.n.shape[0], steps - self.n.shape[1]
        if extra <= 0:
            return self
        pad = Cells.empty(heads, extra)
        n, total, minimum, maximum = (np.concatenate([a, b], axis=1) for a, b in zip(
            (self.n, self.total, self.minimum, self.maximum),
            (pad.n, pad.total, pad.minimum, pad.maximum), strict=True))
        counted = None if self.counted is None else np.concatenate(
            [self.counted, np.zeros((heads, extra, HIST_BINS))], axis=1)
        return Cells(n, total, minimum, maximum, counted, list(self.pending))

    def add_codes(self, codes: np.ndarray) -> None:
        """Count one value per bin code (see the class docstring)."""
        if codes.size:
            self.pending.append(codes)
        if sum(c.size for c in self.pending) * 4 > self.n.size * HIST_BINS:
            self.histogram()

    def add_counted(self, other: Cells) -> None:
        """Add ``other``'s histogram (same heads and steps) to this one's."""
        if other.counted is not None:
            if self.counted is None:
                self.counted = other.counted.copy()
            else:
                self.counted += other.counted
        for codes in other.pending:
            self.add_codes(codes)

    def histogram(self) -> np.ndarray:
        """The histogram (heads, steps, HIST_BINS), its pending codes counted in."""
        heads, steps = self.n.shape
        if self.counted is None:
            self.counted = np.zeros((heads, steps, HIST_BINS))
        if self.pending:
            codes = np.concatenate(self.pending)
            self.pending = []
            step, rest = np.divmod(codes, heads * HIST_BINS)
            np.add.at(self.counted.reshape(-1), (rest // HIST_BINS * steps + step) * HIST_BINS
                      + rest % HIST_BINS, 1.0)
        return self.counted


class RowStats:
    """Streaming summaries of per-row metric values, keyed by site and metric.

    :meth:`merge` hands a cell this state has not seen over as it is, without copying its
    arrays (a histogram is heads x steps x 256 float64); both states then mark it shared,
    and whichever writes to it first copies it (:meth:`_writable`). Reading a shared cell's
    histogram counts its pending codes in, which changes nothing either state reads."""

    def __init__(self, specs: tuple[MetricSpec, ...]) -> None:
        self.specs = {s.name: s for s in specs}
        self.cells: dict[tuple[str, str], Cells] = {}
        self.kinds: dict[str, str | None] = {}
        self._shared: set[tuple[str, str]] = set()

    def reset(self) -> None:
        self.cells.clear()
        self.kinds.clear()
        self._shared.clear()

    def _writable(self, key: tuple[str, str], cells: Cells, steps: int) -> Cells:
        """``cells`` (this state's cell ``key``) with at least ``steps`` steps, in arrays no
        other state holds: grown or copied when needed, and stored under ``key``."""
        if cells.n.shape[1] < steps:
            cells = cells.grown(steps)
        elif key in self._shared:
            cells = cells.copy()
        self._shared.discard(key)
        self.cells[key] = cells
        return cells

    def add(self, site: str, kind: str | None, metric: str, values: torch.Tensor,
            defined: torch.Tensor | None = None, step_offset: int = 0) -> None:
        """Fold per-row ``values`` (batch, heads, steps) in.

        ``defined`` masks the rows that count; non-finite values never count (the numerics
        analyser counts non-finite weights), so no summary column is ever NaN or inf.
        """
        self.add_parts(site, kind, [({metric: (values, defined)}, step_offset)])

    def add_parts(self, site: str, kind: str | None,
                  parts: Sequence[tuple[Mapping[str, Metric], int]]) -> None:
        """Fold parts of one site's rows in, in order, each ``(metric -> (values (batch,
        heads, steps), defined or None), step offset)`` as :meth:`add` folds each metric.

        The parts' metrics go through torch and numpy at once: stacked on a leading metric
        axis, the parts side by side on the batch axis (each over the steps of all of them,
        undefined outside its own), one conversion for them all; each counted value is then
        added to its cell's histogram bin in place. Every cell receives the same values as
        from one :meth:`add` per metric and part: counts, extremes and histograms are exact
        whatever the order, and each part's sum over its batch is added to the running
        totals part after part.
        """
        self.kinds.setdefault(site, kind)
        parts = [(metrics, offset) for metrics, offset in parts if metrics]
        if not parts:
            return
        names = list(parts[0][0])
        shapes = {tuple(values.shape[1:2]) for metrics, _ in parts
                  for values, _ in metrics.values()}
        if len(shapes) > 1 or any(list(metrics) != names or len(
                {tuple(values.shape) for values, _ in metrics.values()}) > 1
                for metrics, _ in parts):  # stacking needs one layout: fold each on its own
            for metrics, offset in parts:
                for metric, item in metrics.items():
                    self.add_parts(site, kind, [({metric: item}, offset)])
            return
        first = min(offset for _, offset in parts)
        stop = max(offset + next(iter(metrics.values()))[0].shape[2]
                   for metrics, offset in parts)
        v, d, bounds = _side_by_side(parts, first, stop)
        count, _, heads, _ = v.shape
        n = d.sum(1).astype(np.float64)  # (metrics, heads, steps)
        totals = [v[:, a:b].sum(1) for a, b in bounds]
        low = np.where(d, v, np.inf).min(1, initial=np.inf)
        high = np.where(d, v, -np.inf).max(1, initial=-np.inf)
        specs = [self.specs[metric] for metric in names]
        lo, hi = np.array([s.lo for s in specs]), np.array([s.hi for s in specs])
        # the counted values, grouped by metric (nonzero reads in C order), and their bins
        which, _, head, step = np.nonzero(d)
        bins = np.clip((v[d] - lo[which]) / (hi - lo)[which] * HIST_BINS, 0,
                       HIST_BINS - 1).astype(np.int64)
        edges = np.searchsorted(which, np.arange(count + 1))
        cols = slice(first, stop)
        for m, metric in enumerate(names):
            key = (site, metric)
            cells = self.cells.get(key)
            if cells is None:
                cells = self.cells[key] = Cells.empty(heads, stop)
            elif cells.n.shape[0] != heads:
                raise AnalysisError(f"site {site!r} had {cells.n.shape[0]} heads, now {heads}")
            else:  # room to spare when growing: calls come step by step
                cells = self._writable(key, cells, stop if cells.n.shape[1] >= stop
                                       else max(stop, 2 * cells.n.shape[1]))
            cells.n[:, cols] += n[m]
            for total in totals:
                cells.total[:, cols] += total[m]
            cells.minimum[:, cols] = np.minimum(cells.minimum[:, cols], low[m])
            cells.maximum[:, cols] = np.maximum(cells.maximum[:, cols], high[m])
            at = slice(edges[m], edges[m + 1])
            cells.add_codes(((first + step[at]) * heads + head[at]) * HIST_BINS + bins[at])

    def merge(self, other: RowStats) -> None:
        """Fold ``other`` in; ``other`` reads as before (a cell new here is shared, see the
        class docstring)."""
        for key, theirs in other.cells.items():
            mine = self.cells.get(key)
            if mine is None:
                self.cells[key] = theirs
                self._shared.add(key)
                other._shared.add(key)
                continue
            if mine.n.shape[0] != theirs.n.shape[0]:
                raise AnalysisError(f"cannot merge site {key[0]!r}: {mine.n.shape[0]} heads here, "
                                    f"{theirs.n.shape[0]} in the other shard")
            steps = max(mine.n.shape[1], theirs.n.shape[1])
            mine, theirs = self._writable(key, mine, steps), theirs.grown(steps)
            mine.n += theirs.n  # in place: this state's own arrays, never another's
            mine.total += theirs.total
            np.minimum(mine.minimum, theirs.minimum, out=mine.minimum)
            np.maximum(mine.maximum, theirs.maximum, out=mine.maximum)
            mine.add_counted(theirs)
        for site, kind in other.kinds.items():
            self.kinds.setdefault(site, kind)

    def frame(self) -> pd.DataFrame:
        """Tidy summary: one row per site x head x step x metric with its count ``n``.

        Built column by column over every cell at once (one frame, not one per cell); the
        columns' dtypes are those a concatenation of per-cell frames gives."""
        columns = ["site", "kind", "layer", "head", "step", "metric", "n", "mean", "sum", "min",
                   "max", *QUANTILE_COLUMNS]
        keys, heads, steps = [], [], []
        for key, c in self.cells.items():
            h, s = np.nonzero(c.n)
            if len(h):
                keys.append(key)
                heads.append(h)
                steps.append(s)
        if not keys:
            frame = pd.DataFrame(columns=columns)
            frame["layer"] = frame["layer"].astype("Int64")
            return frame
        counts = [len(h) for h in heads]

        def gathered(field: str) -> np.ndarray:
            return np.concatenate([getattr(self.cells[key], field)[h, s]
                                   for key, h, s in zip(keys, heads, steps, strict=True)])

        def repeated(values: Sequence[object]) -> np.ndarray:
            each = np.empty(len(values), dtype=object)  # one object per cell, never split
            each[:] = values
            return np.repeat(each, counts)

        n, total = gathered("n"), gathered("total")
        low, high = gathered("minimum"), gathered("maximum")
        specs = [self.specs[metric] for _, metric in keys]
        # a cell of one value has it as every quantile: only the others read a histogram
        varied = low < high
        each = np.split(varied, np.cumsum(counts)[:-1])
        hist = [self.cells[key].histogram()[h[v], s[v]] for key, h, s, v
                in zip(keys, heads, steps, each, strict=True) if v.any()]
        quantiles = {name: low.copy() for name in QUANTILE_COLUMNS}
        if hist:
            read = _quantiles(np.concatenate(hist),
                              np.repeat([s.lo for s in specs], counts)[varied],
                              np.repeat([s.hi for s in specs], counts)[varied],
                              low[varied], high[varied])
            for name, values in read.items():
                quantiles[name][varied] = values
        kinds = [self.kinds.get(site) for site, _ in keys]
        data = {
            "site": pd.array(repeated([site for site, _ in keys]), dtype="str"),
            "kind": (pd.array(repeated(kinds), dtype="str")
                     if all(isinstance(k, str) for k in kinds) else repeated(kinds)),
            "layer": pd.array(repeated([layer_of(site) for site, _ in keys]), dtype="Int64"),
            "head": np.concatenate(heads), "step": np.concatenate(steps),
            "metric": pd.array(repeated([metric for _, metric in keys]), dtype="str"),
            "n": n.astype(np.int64), "mean": total / n, "sum": total, "min": low, "max": high,
            **quantiles}
        frame = pd.DataFrame(data, columns=columns)
        return frame.sort_values(["site", "metric", "head", "step"], ignore_index=True)


def _side_by_side(parts: Sequence[tuple[Mapping[str, Metric], int]], first: int, stop: int
                  ) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]:
    """The parts' values (metrics, batch of every part, heads, ``stop - first`` steps)
    float64, zero where not counted, the bool array of those counted (defined and finite;
    nothing outside a part's own steps) and each part's (start, stop) on the batch axis."""
    blocks_v, blocks_d, bounds, at = [], [], [], 0
    for metrics, offset in parts:
        values = torch.stack([v.detach().to(torch.float64) for v, _ in metrics.values()])
        defined = torch.isfinite(values)
        shape = values.shape[1:]
        if any(given is not None for _, given in metrics.values()):  # one AND for them all
            every = torch.ones((), dtype=torch.bool, device=defined.device).expand(shape)
            defined &= torch.stack([every if given is None
                                    else given.to(defined.device).expand(shape)
                                    for _, given in metrics.values()])
        count, batch, heads, steps = values.shape
        v, d = values.cpu().numpy(), defined.cpu().numpy()
        if offset != first or offset + steps != stop:
            cols = slice(offset - first, offset - first + steps)
            v = np.zeros((count, batch, heads, stop - first))
            d = np.zeros(v.shape, dtype=bool)
            v[..., cols], d[..., cols] = values.cpu().numpy(), defined.cpu().numpy()
        blocks_v.append(v)
        blocks_d.append(d)
        bounds.append((at, at + batch))
        at += batch
    d = blocks_d[0] if len(blocks_d) == 1 else np.concatenate(blocks_d, axis=1)
    v = blocks_v[0] if len(blocks_v) == 1 else np.concatenate(blocks_v, axis=1)
    return np.where(d, v, 0.0), d, bounds


def _quantiles(hist: np.ndarray, lo: np.ndarray, hi: np.ndarray, low: np.ndarray,
               high: np.ndarray) -> dict[str, np.ndarray]:
    """Quantiles of m cells read off their histograms (m, HIST_BINS), linear within a bin,
    clipped to each cell's exact [min, max] (m,); ``lo``, ``hi`` (m,): each cell's metric
    range (:class:`MetricSpec`).

    Resolution is (hi - lo) / HIST_BINS of the metric's range; values outside the range
    fall in the edge bins (their min/max stay exact).
    """
    width = (hi - lo) / HIST_BINS
    cum = np.cumsum(hist, axis=1)
    rows = np.arange(len(hist))
    out = {}
    for q, name in zip(QUANTILES, QUANTILE_COLUMNS, strict=True):
        target = q * cum[:, -1]
        b = np.minimum((cum < target[:, None]).sum(1), hist.shape[1] - 1)  # the left bin
        below = np.where(b > 0, cum[rows, np.maximum(b - 1, 0)], 0.0)
        in_bin = hist[rows, b]
        frac = np.where(in_bin > 0, (target - below) / np.where(in_bin > 0, in_bin, 1.0), 0.0)
        out[name] = np.clip(lo + (b + frac) * width, low, high)
    return out
