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
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import matplotlib
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure as MplFigure

DPI = 96
STYLE = {"text.parse_math": False, "font.size": 9, "axes.titlesize": 10,
         "svg.fonttype": "none"}
MAX_HEATMAP_KEYS = 60  # longer sources are cut for legibility; the caption says so


@dataclass(frozen=True)
class Figure:
    """One figure: the matplotlib figure and the plain text the page shows beside it."""

    name: str
    title: str
    caption: str
    alt: str
    figure: MplFigure

    @cached_property
    def data_uri(self) -> str:
        """The figure as ``data:image/png;base64,...``, rendered once, in the report's style."""
        with matplotlib.rc_context(STYLE):
            return _render(self.figure)


def _subplots(width: float, height: float) -> tuple[MplFigure, matplotlib.axes.Axes]:
    fig = MplFigure(figsize=(width, height))
    return fig, fig.subplots()


def _render(fig: MplFigure) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def attention_heatmap(name: str, weights: np.ndarray, source_tokens: Sequence[str],
                      target_tokens: Sequence[str], *, title: str, caption: str) -> Figure:
    """Weights (queries, keys) of one example and head, tokens on the axes."""
    weights = np.asarray(weights, dtype=float)
    if weights.ndim != 2:
        raise ValueError(f"attention_heatmap needs (queries, keys) weights, got {weights.shape}")
    q, k = weights.shape
    cut = min(k, MAX_HEATMAP_KEYS)
    if cut < k:
        caption = f"{caption} Only the first {cut} of {k} keys are drawn."
    with matplotlib.rc_context(STYLE):
        fig, ax = _subplots(max(4.0, 0.22 * cut + 1.5), max(2.5, 0.24 * q + 1.2))
        sns.heatmap(weights[:, :cut], ax=ax, cmap="viridis", vmin=0.0, vmax=1.0,
                    xticklabels=[str(t) for t in list(source_tokens)[:cut]],
                    yticklabels=[str(t) for t in list(target_tokens)[:q]],
                    cbar_kws={"label": "attention weight"})
        ax.set_xlabel("source token (key)")
        ax.set_ylabel("emitted token (query step)")
        ax.tick_params(axis="x", labelrotation=90)
        ax.tick_params(axis="y", labelrotation=0)
        ax.set_title(title)
    alt = (f"Heatmap of attention weights, {q} query steps by {k} source keys. Source tokens: "
           f"{' '.join(map(str, source_tokens))}. Emitted tokens: "
           f"{' '.join(map(str, target_tokens))}.")
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


def bars(name: str, frame: pd.DataFrame, x: str, y: str, *, title: str,
         caption: str) -> Figure:
    """One vertical bar of ``y`` per category ``x``."""
    with matplotlib.rc_context(STYLE):
        fig, ax = _subplots(6.5, 3.2)
        sns.barplot(data=frame, x=x, y=y, ax=ax, color="#24527a", errorbar=None)
        ax.tick_params(axis="x", labelrotation=20)
        ax.set_title(title)
    cells = "; ".join(f"{k}: {v:.3g}" for k, v in zip(frame[x], frame[y], strict=True))
    return Figure(name, title, caption, f"Bar chart of {y} by {x}. {cells}", fig)


def finite_or_empty(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    """Rows of ``frame`` whose ``column`` is finite (figures never draw NaN)."""
    return frame[np.isfinite(pd.to_numeric(frame[column], errors="coerce"))]
