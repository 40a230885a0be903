"""The checklist's evidence tables, read off the audited model and the metrics table.

The model is inspected, never run: parameters of each site's module (and the tensors they
share storage with) and the dropout inside it. The audit's metrics table (one row per site
x head x step x metric) is folded per site and head, or into one mean or range.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import pandas as pd
from torch import nn


def parameter_table(model: nn.Module, site_modules: Mapping[str, str]) -> pd.DataFrame:
    """Parameters of each site's module and the tensors they share storage with.

    Args:
        model: the audited model.
        site_modules: site name -> module path that computes it ("" for the root module).

    Returns:
        One row per (site, parameter): ``site``, ``module``, ``parameter`` (full name),
        ``shape``, ``numel``, ``shared_with`` (other parameter names backed by the same
        tensor, ``;``-separated, empty when none).
    """
    owners: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(param), []).append(name)
    rows = []
    for site, path, module in _site_modules(model, site_modules):
        prefix = f"{path}." if path else ""
        for name, param in module.named_parameters():
            full = prefix + name
            others = [o for o in owners.get(id(param), []) if o != full]
            rows.append({"site": site, "module": path or "(root)", "parameter": full,
                         "shape": "x".join(map(str, param.shape)), "numel": param.numel(),
                         "shared_with": ";".join(others)})
    return pd.DataFrame(rows, columns=["site", "module", "parameter", "shape", "numel",
                                       "shared_with"])


def site_metric_table(metrics: pd.DataFrame, names: Sequence[str]) -> pd.DataFrame:
    """Per site x head x metric over all query steps: n, mean (row-weighted), min, max.

    ``metrics`` is the audit's tidy table (one row per site x head x step x metric).
    """
    part = metrics[metrics["metric"].isin(names)]
    columns = ["site", "head", "metric", "n", "mean", "min", "max"]
    if part.empty:
        return pd.DataFrame(columns=columns)
    grouped = part.groupby(["site", "head", "metric"], sort=True)
    out = grouped.agg(n=("n", "sum"), total=("sum", "sum"), min=("min", "min"),
                      max=("max", "max")).reset_index()
    out["mean"] = out["total"] / out["n"]
    return out[columns]


def dropout_table(model: nn.Module, site_modules: Mapping[str, str]) -> pd.DataFrame:
    """Dropout modules and ``dropout`` rate attributes (> 0) inside each site's module."""
    rows = []
    for site, path, module in _site_modules(model, site_modules):
        for name, sub in module.named_modules():
            full = ".".join(p for p in (path, name) if p) or "(root)"
            # Rate 0 is no dropout (e.g. nn.LSTM's default inter-layer rate); leave it out.
            if isinstance(sub, nn.modules.dropout._DropoutNd) and sub.p > 0:
                rows.append({"site": site, "module": full, "kind": type(sub).__name__,
                             "p": float(sub.p), "training": sub.training})
            elif isinstance(getattr(sub, "dropout", None), float) and sub.dropout > 0:
                rows.append({"site": site, "module": full, "kind": "dropout attribute",
                             "p": float(sub.dropout), "training": sub.training})
    return pd.DataFrame(rows, columns=["site", "module", "kind", "p", "training"])


def metric_mean(metrics: pd.DataFrame, metric: str) -> float | None:
    """The mean of ``metric`` over every counted row of the metrics table (one row per
    site x head x step x metric), or None when no row defines it."""
    part = metrics[metrics["metric"] == metric]
    n = part["n"].sum()
    return float(part["sum"].sum() / n) if n else None


def metric_range(metrics: pd.DataFrame, low: str, high: str) -> tuple[float, float] | None:
    """(smallest ``low``, largest ``high``) over the metrics table, or None when either is
    missing (e.g. score_min / score_max where no site exposes scores)."""
    lo = metrics.loc[metrics["metric"] == low, "min"]
    hi = metrics.loc[metrics["metric"] == high, "max"]
    return (float(lo.min()), float(hi.max())) if len(lo) and len(hi) else None


def _site_modules(model: nn.Module, site_modules: Mapping[str, str]
                  ) -> Iterator[tuple[str, str, nn.Module]]:
    """(site, module path, module) for each site whose module is in ``model``."""
    modules = dict(model.named_modules())
    for site, path in site_modules.items():
        if (module := modules.get(path)) is not None:
            yield site, path, module
