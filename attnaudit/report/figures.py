"""Report figures: seaborn/matplotlib rendered to PNG and embedded as data URIs.

Every function takes plain data (arrays, tidy DataFrames with docs/metrics.md names) and returns a
:class:`Figure` whose ``title``, ``caption`` and ``alt`` are plain text; the HTML template
escapes them. Token labels are drawn as literal text (mathtext is off, so ``$`` and ``_`` in
a token are not interpreted). Figures are built with :class:`matplotlib.figure.Figure`
directly, never through pyplot, so no backend or global figure state of the caller changes.
"""

from __future__ import annotations

import base64
import io
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import matplotlib
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure as MplFigure

from attnaudit.errors import ReportError

if TYPE_CHECKING:  # matplotlib.typing is new in matplotlib 3.8
    from matplotlib.typing import RcKeyType

DPI = 96
TICK_PT = 9  # tick labels, in points: TICK_PT * DPI / 72 = 12 pixels of the PNG
STYLE: dict[RcKeyType, Any] = {"text.parse_math": False, "font.size": 9, "axes.titlesize": 10,
         "xtick.labelsize": TICK_PT, "ytick.labelsize": TICK_PT, "svg.fonttype": "none"}
# The page never draws a figure narrower than this share of its PNG width (its box scrolls
# instead), so that tick labels stay at least MIN_SCALE * 12 = 9 pixels at 100 % zoom.
MIN_SCALE = 0.75
# Side-by-side panels wrap onto further rows past this width (inches: 1248 pixels, which the
# page shows at full size from a 1280-pixel window).
MAX_ROW_INCHES = 13.0
MAX_HEATMAP_KEYS = 60  # longer sources are cut for legibility; the caption says so
MAX_HEATMAP_QUERIES = 60  # and longer outputs


@dataclass(frozen=True)
class Figure:
    """One figure: the matplotlib figure and the plain text the page shows beside it."""

    name: str
    title: str
    caption: str
    alt: str
    figure: MplFigure

    @cached_property
    def png(self) -> bytes:
        """The figure as PNG bytes, rendered once, in the report's style."""
        with matplotlib.rc_context(STYLE):
            return _render(self.figure)

    @property
    def data_uri(self) -> str:
        """The figure as ``data:image/png;base64,...``."""
        return "data:image/png;base64," + base64.b64encode(self.png).decode("ascii")

    @property
    def pixels(self) -> tuple[int, int]:
        """(width, height) of the PNG in pixels (read from its header)."""
        width, height = struct.unpack(">II", self.png[16:24])
        return width, height

    @property
    def min_width(self) -> int:
        """The narrowest width in pixels the page may draw it at (:data:`MIN_SCALE`)."""
        return math.ceil(MIN_SCALE * self.pixels[0])


def _subplots(width: float, height: float) -> tuple[MplFigure, matplotlib.axes.Axes]:
    fig = MplFigure(figsize=(width, height))
    return fig, fig.subplots()


def _render(fig: MplFigure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
    return buffer.getvalue()


# Token labels with their spaces visible: a space, and the word-start markers of byte-level
# BPE (Ġ) and SentencePiece (▁) that stand for one, all drawn as ␣; line breaks and tabs
# (byte-level BPE: Ċ, ĉ) as arrows.
VISIBLE = str.maketrans({" ": "␣", "Ġ": "␣", "▁": "␣", "\n": "↵", "Ċ": "↵", "\r": "↵",
                         "\t": "⇥", "ĉ": "⇥"})
EMPTY_TOKEN = "∅"


def visible_token(token: object) -> str:
    """A token as a tick label: spaces and their markers visible (:data:`VISIBLE`), an empty
    token as ∅."""
    return str(token).translate(VISIBLE) or EMPTY_TOKEN


def heatmap_size(queries: int, keys: int) -> tuple[float, float]:
    """(width, height) in inches for a queries x keys heatmap: a fixed size per cell plus
    room for labels, at least 4 x 2.5 and, since at most MAX_HEATMAP_KEYS keys and
    MAX_HEATMAP_QUERIES queries are drawn, at most about 14.7 x 15.6."""
    cells_k, cells_q = min(keys, MAX_HEATMAP_KEYS), min(queries, MAX_HEATMAP_QUERIES)
    return max(4.0, 0.22 * cells_k + 1.5), max(2.5, 0.24 * cells_q + 1.2)


def attention_heatmap(name: str, weights: np.ndarray, source_tokens: Sequence[str],
                      target_tokens: Sequence[str], *, title: str, caption: str,
                      axes: tuple[str, str] = ("queries", "keys")) -> Figure:
    """Weights (queries, keys) of one example and head, tokens on the axes with their spaces
    visible (:func:`visible_token`); the figure grows with the sequence (:func:`heatmap_size`).
    ``source_tokens`` label the keys (columns), ``target_tokens`` the queries (rows); axes:
    what the rows and the columns are (e.g. "emitted steps", "source tokens")."""
    weights = np.asarray(weights, dtype=float)
    if weights.ndim != 2:
        raise ReportError(f"attention_heatmap needs (queries, keys) weights, got {weights.shape}")
    q, k = weights.shape
    rows, columns = axes
    cut_q, cut_k = min(q, MAX_HEATMAP_QUERIES), min(k, MAX_HEATMAP_KEYS)
    if cut_k < k:
        caption = f"{caption} Only the first {cut_k} of {k} keys are drawn."
    if cut_q < q:
        caption = f"{caption} Only the first {cut_q} of {q} query rows are drawn."
    caption = f"{caption} Spaces are drawn as {VISIBLE[ord(' ')]}."
    sources = [visible_token(t) for t in source_tokens]
    targets = [visible_token(t) for t in target_tokens]
    with matplotlib.rc_context(STYLE):
        fig, ax = _subplots(*heatmap_size(q, k))
        sns.heatmap(weights[:cut_q, :cut_k], ax=ax, cmap="viridis", vmin=0.0, vmax=1.0,
                    xticklabels=sources[:cut_k], yticklabels=targets[:cut_q],
                    cbar_kws={"label": "attention weight"})
        ax.set_xlabel(f"{columns} (keys)")
        ax.set_ylabel(f"{rows} (queries)")
        ax.tick_params(axis="x", labelrotation=90)
        ax.tick_params(axis="y", labelrotation=0)
        ax.set_title(title)
    alt = (f"Heatmap of attention weights, {q} rows ({rows}) by {k} columns ({columns}). "
           f"Columns: {' '.join(sources)}. Rows: {' '.join(targets)}.")
    return Figure(name, title, caption, alt, fig)


def panel_rows(widths: Sequence[float], limit: float = MAX_ROW_INCHES) -> list[list[int]]:
    """Panels of these widths (inches), in order, packed onto rows no wider than ``limit``
    (a panel wider than it gets a row of its own): each row's panel indices."""
    rows: list[list[int]] = []
    used = limit
    for index, width in enumerate(widths):
        if rows and used + width <= limit:
            rows[-1].append(index)
            used += width
        else:
            rows.append([index])
            used = width
    return rows


def paired_heatmaps(name: str, panels: Sequence[tuple[np.ndarray, Sequence[str], str]],
                    step_labels: Sequence[str], *, title: str, caption: str,
                    value_label: str, row_label: str = "emitted token (step)") -> Figure:
    """Heatmaps side by side that share their rows (the emitted steps, named ``row_label``):
    each panel is ``(values (steps, keys) in 0..1, key labels, x-axis label)``; NaN cells
    are left blank.
    Panels wrap onto further rows past :data:`MAX_ROW_INCHES` (:func:`panel_rows`), so that
    the figure is drawn near its own size and its labels stay legible."""
    cut_q = min(len(step_labels), MAX_HEATMAP_QUERIES)
    steps = [visible_token(t) for t in step_labels]
    cuts = [min(values.shape[1], MAX_HEATMAP_KEYS) for values, _, _ in panels]
    notes = [f"Only the first {cut} of {values.shape[1]} {xlabel}s are drawn."
             for cut, (values, _, xlabel) in zip(cuts, panels, strict=True)
             if cut < values.shape[1]]
    if cut_q < len(step_labels):
        notes.append(f"Only the first {cut_q} of {len(step_labels)} steps are drawn.")
    caption = " ".join([caption, *notes, f"Spaces are drawn as {VISIBLE[ord(' ')]}."])
    widths = [heatmap_size(cut_q, cut)[0] for cut in cuts]
    rows = panel_rows(widths)
    with matplotlib.rc_context(STYLE):
        height = heatmap_size(cut_q, 1)[1]
        fig = MplFigure(figsize=(max(sum(widths[i] for i in row) for row in rows),
                                 height * len(rows) + 0.3 * (len(rows) - 1)))
        columns = max(sum(cuts[i] + 2 for i in row) for row in rows)
        grid = fig.add_gridspec(len(rows), columns, hspace=0.45)
        first = None
        for r, row in enumerate(rows):
            start = 0
            for at in row:
                values, labels, xlabel = panels[at]
                ax = fig.add_subplot(grid[r, start:start + cuts[at] + 2], sharey=first)
                first = first or ax
                start += cuts[at] + 2
                last = at == row[-1]
                sns.heatmap(np.asarray(values, dtype=float)[:cut_q, :cuts[at]], ax=ax,
                            cmap="viridis", vmin=0.0, vmax=1.0, cbar=last,
                            xticklabels=[visible_token(t) for t in labels][:cuts[at]],
                            yticklabels=steps[:cut_q],
                            cbar_kws={"label": value_label} if last else None)
                ax.set_xlabel(xlabel)
                ax.tick_params(axis="x", labelrotation=90)
                ax.tick_params(axis="y", labelrotation=0, labelleft=at == row[0])
                ax.set_ylabel(row_label if at == row[0] else "")
        fig.suptitle(title)
    keys = ". ".join(f"{xlabel}s: {' '.join(visible_token(t) for t in labels)}"
                     for _, labels, xlabel in panels)
    alt = (f"{len(panels)} heatmaps of {value_label} side by side, {len(step_labels)} "
           f"emitted steps by {', '.join(str(v.shape[1]) for v, _, _ in panels)} keys. "
           f"Steps: {' '.join(steps)}. {keys}.")
    return Figure(name, title, caption, alt, fig)


def site_head_heatmap(name: str, frame: pd.DataFrame, value: str, *, title: str,
                      caption: str, vmin: float | None = None,
                      vmax: float | None = None) -> Figure:
    """A (site, head) grid of ``value``: one row per site, one column per head."""
    grid = frame.pivot_table(index="site", columns="head", values=value, aggfunc="mean")
    with matplotlib.rc_context(STYLE):
        fig, ax = _subplots(max(4.0, 0.9 * grid.shape[1] + 3.5),
                            max(1.8, 0.45 * grid.shape[0] + 1.0))
        sns.heatmap(grid, ax=ax, annot=True, fmt=".3g", cmap="mako", vmin=vmin, vmax=vmax,
                    cbar_kws={"label": value})
        ax.set_xlabel("head")
        ax.set_ylabel("site")
        ax.set_title(title)
    cells = "; ".join(f"{site} head {head}: {val:.3g}" for (site, head), val
                      in grid.stack().items())
    return Figure(name, title, caption, f"Grid of {value} by site and head. {cells}", fig)


def site_bars(name: str, frame: pd.DataFrame, value: str, *, title: str, caption: str,
              tolerance: float | None = None) -> Figure:
    """One horizontal bar per site for ``value`` (one row per site); ``tolerance`` dashed."""
    with matplotlib.rc_context(STYLE):
        fig, ax = _subplots(6.0, max(1.6, 0.4 * len(frame) + 1.0))
        sns.barplot(data=frame, x=value, y="site", ax=ax, color="#3a9188", orient="h")
        if tolerance is not None:
            ax.axvline(tolerance, color="#d97745", linestyle="--", linewidth=1)
            ax.set_xlim(0.0, max(2 * tolerance, float(frame[value].max()) * 1.1))
        ax.set_title(title)
    values = "; ".join(f"{s}: {v:.3g}" for s, v in zip(frame["site"], frame[value], strict=True))
    return Figure(name, title, caption, f"Bar chart of {value} per site. {values}", fig)


def binned_violins(name: str, frame: pd.DataFrame, x: str, y: str, *, title: str,
                   caption: str, order: Sequence[str] | None = None,
                   threshold: float | None = None) -> Figure:
    """Distribution of ``y`` per category ``x`` (e.g. median TVD per max-attention bin)."""
    with matplotlib.rc_context(STYLE):
        fig, ax = _subplots(6.5, 3.2)
        sns.violinplot(data=frame, x=x, y=y, order=order, ax=ax, cut=0, color="#d97745",
                       density_norm="width", inner="quartile")
        if threshold is not None:
            ax.axhline(threshold, color="#5f6b76", linestyle="--", linewidth=1)
        ax.set_title(title)
    counts = frame.groupby(x, observed=True)[y].agg(["count", "median"])
    summary = "; ".join(f"{k}: {int(r['count'])} rows, median {r['median']:.3g}"
                        for k, r in counts.iterrows())
    return Figure(name, title, caption, f"Violin plot of {y} by {x}. {summary}", fig)


def interval_bars(name: str, frame: pd.DataFrame, x: str, y: str, low: str, high: str, *,
                  title: str, caption: str,
                  band: tuple[float, float, str] | None = None) -> Figure:
    """One vertical bar of ``y`` per category ``x`` with an error bar from ``low`` to
    ``high``; ``band`` = (lower, upper, label): a shaded horizontal reference band."""
    with matplotlib.rc_context(STYLE):
        fig, ax = _subplots(max(6.5, 0.75 * len(frame) + 1.5), 3.4)
        positions = np.arange(len(frame))
        values = frame[y].to_numpy(dtype=float)
        errors = np.stack([values - frame[low].to_numpy(dtype=float),
                           frame[high].to_numpy(dtype=float) - values])
        if band is not None:
            ax.axhspan(band[0], band[1], color="#d97745", alpha=0.18, zorder=0,
                       label=f"{band[2]}: {band[0]:g} to {band[1]:g}")
        ax.bar(positions, values, color="#24527a", yerr=errors, capsize=4,
               error_kw={"ecolor": "#1d2329", "elinewidth": 1})
        ax.set_xticks(positions, [str(v) for v in frame[x]])
        ax.tick_params(axis="x", labelrotation=20)
        for label in ax.get_xticklabels():
            label.set_horizontalalignment("right")
        ax.axhline(0.0, color="#5f6b76", linewidth=0.8)
        ax.set_ylabel(y)
        if band is not None:
            ax.legend(loc="best", fontsize=8, frameon=False)
        ax.set_title(title)
    cells = "; ".join(f"{r[x]}: {r[y]:.3g} ({r[low]:.3g} to {r[high]:.3g})"
                      for _, r in frame.iterrows())
    extra = f" Shaded band: {band[2]}, {band[0]:.3g} to {band[1]:.3g}." if band else ""
    return Figure(name, title, caption, f"Bar chart of {y} by {x} with intervals. {cells}."
                  + extra, fig)


def finite_or_empty(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    """Rows of ``frame`` whose ``column`` is finite (figures never draw NaN)."""
    return frame[np.isfinite(pd.to_numeric(frame[column], errors="coerce"))]
