"""Backend parity in the sites table: each SDPA site's gap between the deployed fused kernel
and capture's explicit computation (:mod:`attnaudit.capturing.parity`), held to a tolerance
by dtype.

Columns added to the sites table: ``backend_parity_calls`` (calls compared; 0 where the site
has no fused kernel to compare with), ``backend_parity_gap`` (largest |fused - explicit|),
``backend_parity_relative`` (that gap over the explicit output's largest magnitude, the
largest over the calls) and ``backend_parity_tolerance`` (the relative gap allowed). A site
whose relative gap exceeds its tolerance fails the gate's ``backend_parity`` check.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd

from attnaudit.capturing.parity import ParityGap
from attnaudit.capturing.sites import site_base

# Relative gaps allowed: half-precision kernels accumulate differently from capture's fp32
# softmax; fp32 and fp64 kernels agree far more closely than any real bug would.
PARITY_TOLERANCE = {"float16": 2e-2, "bfloat16": 2e-2}
PARITY_TOLERANCE_DEFAULT = 1e-4

PARITY_COLUMNS = ["backend_parity_calls", "backend_parity_gap", "backend_parity_relative",
                  "backend_parity_tolerance"]


def parity_tolerance(dtype: str) -> float:
    """The relative gap allowed between a fused kernel's output and the explicit one."""
    return PARITY_TOLERANCE.get(dtype, PARITY_TOLERANCE_DEFAULT)


def merge_parity(into: dict[str, ParityGap], new: Mapping[str, ParityGap]) -> None:
    """Fold one capture's (or rank's) gaps into ``into``, site by site."""
    for name, gap in new.items():
        into[name] = into[name].merged(gap) if name in into else gap


def with_parity(sites: pd.DataFrame, parity: Mapping[str, ParityGap]) -> pd.DataFrame:
    """The sites table with :data:`PARITY_COLUMNS`; a site takes the gap measured at its
    name, or at its call site's (prompt views of one call share its gap)."""
    by_base = {site_base(name): gap for name, gap in parity.items()}
    gaps = [parity.get(name, by_base.get(site_base(name))) for name in sites["site"]]
    return sites.assign(
        backend_parity_calls=[0 if g is None else g.calls for g in gaps],
        backend_parity_gap=[math.nan if g is None else g.gap for g in gaps],
        backend_parity_relative=[math.nan if g is None else g.relative for g in gaps],
        backend_parity_tolerance=[math.nan if g is None else parity_tolerance(g.dtype)
                                  for g in gaps])
