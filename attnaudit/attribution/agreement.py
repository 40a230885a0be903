"""Agreement between importance rankings of the source keys (docs/metrics.md, "Attribution and
agreement").

Per (example, step) row and per pair of importance measures (attention, an attribution
method, leave-one-out), over the row's eligible keys only:

- ``kendall_tau``: Kendall tau-b with its two-sided p-value ``kendall_p``, exactly as
  ``scipy.stats.kendalltau(a, b, variant="b")`` computes them (method "auto": the exact
  null distribution when neither side has ties and n <= 33 or the count of discordant or
  concordant pairs is at most 1, else the tie-corrected normal approximation);
- ``spearman``: Spearman rank correlation (average ranks for ties) with ``spearman_p`` as
  ``scipy.stats.spearmanr`` computes it (Student t with n - 2 degrees of freedom; for two
  keys, where scipy has no p-value, 1.0);
- ``top_k_overlap``: ``|top-k(a) & top-k(b)| / k'`` with ``k' = min(top_k, n_valid)``;
  within a tie the earlier source position ranks first.

The statistics are computed for many rows at once (rows grouped by their number of eligible
keys, all key pairs compared in one array operation), so thousands of (example, step) rows
cost milliseconds rather than one scipy call each; tests check every value against scipy
row by row.

A row with fewer than two eligible keys, where either measure is constant over them or is
not finite on one of them (leave-one-out of a key the model cannot do without may give
NaN), has no defined rank correlation: it is kept in the per-row table with ``excluded``
saying why and its metrics empty, and summaries count it in ``n_excluded`` instead of
averaging it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from functools import cache

import numpy as np
import pandas as pd
import torch
from scipy.stats import norm
from scipy.stats import t as student_t

from attnaudit.errors import InterventionError

SIGNIFICANCE = 0.05
DEFAULT_TOP_K = 3
ATTENTION, GRADIENT, LOO = "attention", "input_x_gradient", "loo"

METRIC_COLUMNS = ["kendall_tau", "kendall_p", "spearman", "spearman_p", "top_k_overlap"]
ROW_COLUMNS = ["method_a", "method_b", "example", "step", "n_valid", "excluded", "top_k",
               *METRIC_COLUMNS]
SUMMARY_COLUMNS = ["method_a", "method_b", "n", "n_excluded", "kendall_tau_mean",
                   "kendall_tau_std", "sig_frac", "spearman_mean", "spearman_std",
                   "top_k_overlap_mean", "top_k"]

# Jain & Wallace (2019), BiLSTM encoder + additive attention, mean Kendall tau between
# attention and gradient importance; gradient vs leave-one-out is typically 0.5-0.7 and
# serves as a ceiling for how well two explanation methods can agree.
JAIN_WALLACE_REFERENCE = pd.DataFrame(
    [(dataset, ATTENTION, GRADIENT, tau, tau)
     for dataset, tau in [("SST", 0.35), ("IMDB", 0.44), ("AG News", 0.39), ("SNLI", 0.31),
                          ("CNN", 0.24)]]
    + [("typical", GRADIENT, LOO, 0.5, 0.7)],
    columns=["dataset", "method_a", "method_b", "kendall_tau_low", "kendall_tau_high"],
).assign(source="Jain & Wallace (2019), BiLSTM + additive attention")


def _check_inputs(importances: Mapping[str, torch.Tensor], keys: torch.Tensor,
                  steps: torch.Tensor,
                  pairs: Sequence[tuple[str, str]] | None) -> tuple[list[tuple[str, str]],
                                                                    torch.Tensor]:
    """The pairs to compare and the eligible keys per (example, step), bool (B, T, n)."""
    if steps.ndim != 2 or steps.dtype != torch.bool:
        raise InterventionError(f"steps must be bool (B, T), got {steps.dtype} "
                                f"{tuple(steps.shape)}")
    if keys.dtype != torch.bool or keys.ndim not in (2, 3) or keys.shape[0] != steps.shape[0]:
        raise InterventionError(f"keys must be bool (B={steps.shape[0]}, n) or (B, T, n), got "
                                f"{keys.dtype} {tuple(keys.shape)}")
    keys = keys[:, None, :].expand(-1, steps.shape[1], -1) if keys.ndim == 2 else keys
    expected = (*steps.shape, keys.shape[-1])
    if tuple(keys.shape) != expected:
        raise InterventionError(f"keys (B, T, n) {tuple(keys.shape)} do not match steps "
                                f"{tuple(steps.shape)}")
    for name, value in importances.items():
        if tuple(value.shape) != expected:
            raise InterventionError(f"importance {name!r} has shape {tuple(value.shape)}, expected "
                                    f"(B, T, n) = {expected}")
    names = list(importances)
    pairs = list(itertools.combinations(names, 2)) if pairs is None else list(pairs)
    unknown = sorted({m for pair in pairs for m in pair} - set(names))
    if unknown or any(len(pair) != 2 or pair[0] == pair[1] for pair in pairs):
        raise InterventionError(f"pairs must name two different measures among {names}; "
                                f"got {pairs}")
    if not pairs:
        raise InterventionError("agreement needs at least two importance measures")
    return pairs, keys


EXACT_MAX_KEYS = 33  # scipy's limit for the exact tau null distribution without ties
_CHUNK_PAIRS = 2**21  # rows x keys^2 per array operation: bounds memory for long sources


@cache
def _inversions_cdf(n: int) -> np.ndarray:
    """P(K <= k), k = 0 .. n(n-1)/2, for K the inversions of a uniform random permutation of
    n items: Kendall's exact null distribution of the discordant pairs (Mahonian numbers,
    counted with Python integers)."""
    counts = [1]
    for size in range(2, n + 1):
        grown = [0] * (len(counts) + size - 1)
        for k, c in enumerate(counts):
            for extra in range(size):
                grown[k + extra] += c
        counts = grown
    total = math.factorial(n)
    return np.array([c / total for c in itertools.accumulate(counts)])


def _kendall_exact_p(n: int, discordant: np.ndarray) -> np.ndarray:
    """Two-sided exact p-values for rows without ties, as scipy's method "exact"."""
    tot = n * (n - 1) // 2
    c = np.minimum(discordant, tot - discordant)
    if n <= EXACT_MAX_KEYS:
        p = 2.0 * _inversions_cdf(n)[c]
    else:  # only c <= 1 comes here: 1 or n permutations lie that far out
        p = np.where(c == 0, 2.0 / math.factorial(n), 2.0 / math.factorial(n - 1))
    return np.where(4 * c == n * (n - 1), 1.0, np.minimum(p, 1.0))


def _tie_counts(signs: np.ndarray) -> np.ndarray:
    """(R, n) how many keys of the row share each key's value (itself included)."""
    return (signs == 0).sum(-1)


def rank_agreement(a: np.ndarray, b: np.ndarray, top_k: int) -> dict[str, np.ndarray]:
    """Rank agreement of R rows of n keys each: a, b (R, n) float, n >= 2, no constant row.

    Returns ``kendall_tau, kendall_p, spearman, spearman_p, top_k_overlap``, each (R,).
    """
    n = a.shape[1]
    signs_a = np.sign(a[:, :, None] - a[:, None, :])  # (R, n, n): sign(a_i - a_j)
    signs_b = np.sign(b[:, :, None] - b[:, None, :])
    upper = np.triu_indices(n, 1)
    pair_a, pair_b = signs_a[:, upper[0], upper[1]], signs_b[:, upper[0], upper[1]]
    agree = pair_a * pair_b
    con_minus_dis = agree.sum(-1)
    discordant = (agree < 0).sum(-1)
    tot = n * (n - 1) // 2
    ties_a, ties_b = (pair_a == 0).sum(-1), (pair_b == 0).sum(-1)
    tau = np.clip(con_minus_dis / np.sqrt(tot - ties_a) / np.sqrt(tot - ties_b), -1.0, 1.0)

    count_a, count_b = _tie_counts(signs_a), _tie_counts(signs_b)
    m = n * (n - 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        var = ((m * (2 * n + 5) - ((count_a - 1) * (2 * count_a + 5)).sum(-1)
                - ((count_b - 1) * (2 * count_b + 5)).sum(-1)) / 18
               + 2.0 * ties_a * ties_b / m
               + ((count_a - 1) * (count_a - 2)).sum(-1) * ((count_b - 1) * (count_b - 2)).sum(-1)
               / (9 * m * (n - 2)))
        kendall_p = 2.0 * norm.sf(np.abs(con_minus_dis / np.sqrt(var)))
    exact = (ties_a == 0) & (ties_b == 0) & (
        (n <= EXACT_MAX_KEYS) | (np.minimum(discordant, tot - discordant) <= 1))
    if exact.any():
        kendall_p[exact] = _kendall_exact_p(n, discordant[exact])

    rank_a = (signs_a > 0).sum(-1) + (count_a + 1) / 2.0  # average ranks, 1-based
    rank_b = (signs_b > 0).sum(-1) + (count_b + 1) / 2.0
    centred_a = rank_a - rank_a.mean(-1, keepdims=True)
    centred_b = rank_b - rank_b.mean(-1, keepdims=True)
    rho = np.clip((centred_a * centred_b).sum(-1)
                  / np.sqrt((centred_a**2).sum(-1) * (centred_b**2).sum(-1)), -1.0, 1.0)
    if n > 2:
        with np.errstate(divide="ignore"):
            t_stat = rho * np.sqrt((n - 2) / ((rho + 1.0) * (1.0 - rho))).clip(0)
        spearman_p = 2.0 * student_t.sf(np.abs(t_stat), n - 2)
    else:
        spearman_p = np.ones_like(rho)

    k = min(top_k, n)
    top_a, top_b = np.zeros(a.shape, bool), np.zeros(b.shape, bool)
    np.put_along_axis(top_a, np.argsort(-a, axis=-1, kind="stable")[:, :k], True, -1)
    np.put_along_axis(top_b, np.argsort(-b, axis=-1, kind="stable")[:, :k], True, -1)
    return {"kendall_tau": tau, "kendall_p": kendall_p, "spearman": rho,
            "spearman_p": spearman_p, "top_k_overlap": (top_a & top_b).sum(-1) / k}


def agreement(importances: Mapping[str, torch.Tensor], keys: torch.Tensor, steps: torch.Tensor,
              pairs: Sequence[tuple[str, str]] | None = None,
              top_k: int = DEFAULT_TOP_K) -> pd.DataFrame:
    """Rank agreement per (pair, example, step) over eligible keys.

    Args:
        importances: name -> (B, T, n) importance of each source key at each step (e.g.
            ``attention``, the methods of :func:`~attnaudit.attribution.methods.attribute`,
            ``loo``); only the ranking over eligible keys matters.
        keys: bool (B, n), or (B, T, n) when eligibility differs by step: eligible keys.
        steps: (B, T) bool, the steps to compare.
        pairs: (method_a, method_b) pairs; default every pair in the mapping's order.
        top_k: size of the top sets compared by ``top_k_overlap``.

    Returns one row per pair x valid (example, step) with :data:`ROW_COLUMNS`, ordered by
    pair, example, step; rows whose rank correlation is undefined have ``excluded`` set and
    empty (NaN) metrics.
    """
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise InterventionError(f"top_k must be a positive int, got {top_k!r}")
    pairs, keys = _check_inputs(importances, keys, steps, pairs)
    example, step = (t.numpy() for t in steps.cpu().nonzero(as_tuple=True))
    eligible = keys.cpu().numpy()[example, step]  # (R, n)
    n_valid = eligible.sum(-1)
    values = {name: t.detach().cpu().double().numpy()[example, step]
              for name, t in importances.items()}
    frames = []
    for name_a, name_b in pairs:
        metrics = {name: np.full(len(example), np.nan) for name in METRIC_COLUMNS}
        excluded = np.where(n_valid < 2, "fewer than 2 eligible keys", "").astype(object)
        for name in (name_a, name_b):
            broken = (n_valid >= 2) & ~np.where(eligible, np.isfinite(values[name]), True).all(-1)
            excluded[broken & (excluded == "")] = f"non-finite {name}"
        for n in np.unique(n_valid[excluded == ""]):
            rows = np.nonzero((n_valid == n) & (excluded == ""))[0]
            a = values[name_a][rows][eligible[rows]].reshape(len(rows), n)
            b = values[name_b][rows][eligible[rows]].reshape(len(rows), n)
            constant = (a.min(-1) == a.max(-1)) | (b.min(-1) == b.max(-1))
            excluded[rows[constant]] = "constant importance"
            rows, a, b = rows[~constant], a[~constant], b[~constant]
            per_chunk = max(1, _CHUNK_PAIRS // (n * n))
            for at in range(0, len(rows), per_chunk):
                part = slice(at, at + per_chunk)
                for name, value in rank_agreement(a[part], b[part], top_k).items():
                    metrics[name][rows[part]] = value
        frames.append(pd.DataFrame({"method_a": name_a, "method_b": name_b, "example": example,
                                    "step": step, "n_valid": n_valid, "excluded": excluded,
                                    "top_k": top_k, **metrics}))
    return pd.concat(frames, ignore_index=True)[ROW_COLUMNS]


def _std(values: pd.Series) -> float:
    return float(values.std(ddof=1)) if len(values) > 1 else 0.0


def summarise_agreement(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per pair with :data:`SUMMARY_COLUMNS`: mean and sample std (0 for a single
    row) of ``kendall_tau`` and ``spearman``, ``sig_frac`` = share of rows with
    ``kendall_p <= 0.05``, mean ``top_k_overlap``, ``n`` rows with a defined correlation and
    ``n_excluded`` rows without. A pair with no defined row has no summary row (its
    exclusions are in ``rows``); no summary value is ever NaN.
    """
    missing = [c for c in ROW_COLUMNS if c not in rows.columns]
    if missing:
        raise InterventionError(f"summarise_agreement needs the table agreement() returns; missing "
                                f"columns {missing}")
    out = []
    for (name_a, name_b), group in rows.groupby(["method_a", "method_b"], sort=False):
        defined = group[group["excluded"] == ""]
        if defined.empty:
            continue
        out.append({
            "method_a": name_a, "method_b": name_b, "n": len(defined),
            "n_excluded": len(group) - len(defined),
            "kendall_tau_mean": float(defined["kendall_tau"].mean()),
            "kendall_tau_std": _std(defined["kendall_tau"]),
            "sig_frac": float((defined["kendall_p"] <= SIGNIFICANCE).mean()),
            "spearman_mean": float(defined["spearman"].mean()),
            "spearman_std": _std(defined["spearman"]),
            "top_k_overlap_mean": float(defined["top_k_overlap"].mean()),
            "top_k": int(defined["top_k"].iloc[0]),
        })
    return pd.DataFrame.from_records(out, columns=SUMMARY_COLUMNS)


def beside_reference(summary: pd.DataFrame, dataset: str) -> pd.DataFrame:
    """Our mean Kendall tau per pair stacked above the Jain & Wallace reference values.

    Columns: ``source, dataset, method_a, method_b, kendall_tau_low, kendall_tau_high``
    (low = high = our mean for our rows; the reference gives a range for gradient vs
    leave-one-out). The reference's "gradient" is ``input_x_gradient`` with attention
    detached, as Jain & Wallace compute it.
    """
    ours = pd.DataFrame({
        "source": "attnaudit",
        "dataset": dataset,
        "method_a": summary["method_a"],
        "method_b": summary["method_b"],
        "kendall_tau_low": summary["kendall_tau_mean"],
        "kendall_tau_high": summary["kendall_tau_mean"],
    })
    return pd.concat([ours, JAIN_WALLACE_REFERENCE[ours.columns]], ignore_index=True)
