"""Bootstrap intervals over examples: the uncertainty every explanation number carries.

Rows of one example (its emitted steps, heads, edited copies) are not independent draws, so
the resampled unit is the example: each of ``resamples`` replicates draws as many examples
as were audited, with replacement, and recomputes the statistic over all rows of the drawn
examples. The interval is the percentile interval of the replicates (Efron & Tibshirani
1993, ch. 13) at ``level`` (95 % by default), seeded, so that the same audit gives the same
interval. A statistic over fewer than two examples has no interval (``low``/``high`` NaN,
:attr:`Interval.defined` False); consumers say so in words rather than print a NaN.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from attnaudit.errors import AnalysisError

BOOTSTRAP_RESAMPLES = 1000  # replicates per interval
BOOTSTRAP_LEVEL = 0.95  # two-sided coverage of the percentile interval
BOOTSTRAP_SEED = 0  # the generator's seed: one audit, one interval


@dataclass(frozen=True)
class Interval:
    """A statistic and its bootstrap interval.

    estimate: the statistic on the rows as audited. low, high: the percentile interval
    (NaN when fewer than two examples). examples, rows: what it was computed over (finite
    rows only). resamples, level, seed: how.
    """

    estimate: float
    low: float
    high: float
    examples: int
    rows: int
    resamples: int = BOOTSTRAP_RESAMPLES
    level: float = BOOTSTRAP_LEVEL
    seed: int = BOOTSTRAP_SEED

    @property
    def defined(self) -> bool:
        """True when the interval exists (two or more examples)."""
        return bool(np.isfinite(self.low) and np.isfinite(self.high))

    def columns(self, name: str) -> dict[str, float]:
        """``{name: estimate, name_low: low, name_high: high}``: how tables hold it."""
        return {name: self.estimate, f"{name}_low": self.low, f"{name}_high": self.high}

    def __str__(self) -> str:
        if not np.isfinite(self.estimate):
            return "not computed (no finite rows)"
        if not self.defined:
            return f"{self.estimate:.3g} (one example: no interval)"
        return (f"{self.estimate:.3g} [{self.low:.3g}, {self.high:.3g}] "
                f"({self.level:.0%} bootstrap over {self.examples} examples)")


def bootstrap_interval(values: np.ndarray, examples: np.ndarray | None = None, *,
                       statistic: Callable[[np.ndarray], float] | None = None,
                       resamples: int = BOOTSTRAP_RESAMPLES, level: float = BOOTSTRAP_LEVEL,
                       seed: int = BOOTSTRAP_SEED) -> Interval:
    """The ``statistic`` of ``values`` with its bootstrap interval over examples.

    Args:
        values: (N,) one number per row (bool rows give shares). Non-finite rows are left
            out (counted in neither ``rows`` nor ``examples``).
        examples: (N,) the example each row belongs to (any hashable ids); None: each row
            is its own example.
        statistic: rows -> number; None is the mean, computed per replicate from
            per-example sums and counts (no copy of the rows per replicate).
        resamples, level, seed: see the module docstring.
    """
    if not 0 < level < 1:
        raise AnalysisError(f"level must be in (0, 1), got {level}")
    if resamples < 1:
        raise AnalysisError(f"resamples must be at least 1, got {resamples}")
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    ids = np.arange(len(values)) if examples is None else np.asarray(examples).reshape(-1)
    if len(ids) != len(values):
        raise AnalysisError(f"{len(values)} values but {len(ids)} example ids")
    finite = np.isfinite(values)
    values, ids = values[finite], ids[finite]
    _, group = np.unique(ids, return_inverse=True)
    n_examples = int(group.max()) + 1 if len(group) else 0
    estimate = (float(values.mean()) if statistic is None else float(statistic(values))) \
        if len(values) else float("nan")
    if n_examples < 2:
        return Interval(estimate, float("nan"), float("nan"), n_examples, len(values),
                        resamples, level, seed)
    draws = np.random.default_rng(seed).integers(0, n_examples, (resamples, n_examples))
    if statistic is None:
        sums = np.bincount(group, weights=values, minlength=n_examples)
        counts = np.bincount(group, minlength=n_examples).astype(np.float64)
        replicates = sums[draws].sum(1) / counts[draws].sum(1)
    else:
        rows_of = [np.flatnonzero(group == g) for g in range(n_examples)]
        replicates = np.array([statistic(values[np.concatenate([rows_of[g] for g in draw])])
                               for draw in draws], dtype=np.float64)
    tail = (1 - level) / 2
    low, high = np.quantile(replicates, [tail, 1 - tail])
    return Interval(estimate, float(low), float(high), n_examples, len(values), resamples,
                    level, seed)
