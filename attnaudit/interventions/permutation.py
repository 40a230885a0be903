"""Permutation test (Jain & Wallace): shuffle each row's weights among its eligible keys.

For every (example, step) row, ``n_permutations`` seeded permutations of the weights among
eligible keys (padding and special keys stay in place), each site and head permuted
independently, at every selected site at once; per row the median TVD / JSD over
permutations (for an even count, the mean of the two middle values) and the share of
permutations that flip the argmax.
"""

from __future__ import annotations

import pandas as pd
import torch

from attnaudit.errors import InterventionError
from attnaudit.interventions.draws import eligible_draws
from attnaudit.interventions.outputs import median
from attnaudit.interventions.reference_run import Reference, RowIndex
from attnaudit.interventions.runner import (
    progress_bar,
    row_columns,
    row_generator,
    run_items,
    site_head_rows,
)
from attnaudit.targets.contract import Seq2SeqTarget

N_PERMUTATIONS = 100
# docs/metrics.md: a median permutation TVD below this counts as a small output change
SMALL_TVD = 0.05
# docs/metrics.md: a row whose largest eligible weight exceeds this counts as sharp
SHARP_ATTENTION = 0.75
N_BINS = 4
_SALT = 1
_CACHE_ROWS = 4096  # rows whose permutations are kept between calls


def eligible_permutation(eligible: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Index permutations that shuffle only eligible keys.

    eligible: bool (n,). noise: (..., n) uniform draws, one permutation per leading index.
    Returns long (..., n), ``new[j] = old[perm[j]]``: eligible positions receive eligible
    positions in random order; every other position maps to itself.
    """
    n = eligible.shape[-1]
    position = torch.arange(n, dtype=noise.dtype)
    shuffled = torch.argsort(torch.where(eligible, noise, 2.0 + position), dim=-1)
    in_order = torch.argsort(torch.where(eligible, position, n + position)).expand_as(shuffled)
    return torch.empty_like(shuffled).scatter_(-1, in_order, shuffled)


class _PermutationEdit:
    """Row edit for item ``row * R + r``: that row's permutation ``r`` at each site-head."""

    def __init__(self, ref: Reference, rows: RowIndex, n_permutations: int) -> None:
        self.ref, self.rows, self.n = ref, rows, n_permutations
        self._cache: dict[int, torch.Tensor] = {}

    def permutations(self, row: int) -> torch.Tensor:
        """(R, S*H, n) long for one row, drawn from the row's own generator."""
        if row not in self._cache:
            if len(self._cache) > _CACHE_ROWS:
                self._cache.clear()
            ref, ex, st = self.ref, int(self.rows.example[row]), int(self.rows.step[row])
            gen, eligible = row_generator(ref, ex, st, _SALT), ref.eligible[ex, st]
            noise = eligible_draws(torch.rand, gen, (self.n, ref.n_site_heads), eligible)
            self._cache[row] = eligible_permutation(eligible, noise)
        return self._cache[row]

    def __call__(self, site: str, old: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        unique, which = torch.unique(items // self.n, return_inverse=True)
        perms = torch.stack([site_head_rows(self.ref, site, self.permutations(int(r)))
                             for r in unique])  # (u, R, H, n)
        return old.gather(-1, perms[which, items % self.n])


def permutation_test(target: Seq2SeqTarget, ref: Reference, rows: RowIndex | None = None, *,
                     n_permutations: int = N_PERMUTATIONS, chunk_size: int | None = None,
                     progress: bool = False, median_draw: bool = False) -> pd.DataFrame:
    """Per row: ``perm_median_tvd``, ``perm_median_jsd``, ``perm_flip_rate``, ``max_attention``.

    Returns one DataFrame row per (example, step): columns example (global index), step,
    n_valid, max_attention (largest eligible weight of the site-and-head mean), and the
    three permutation metrics; with ``median_draw``, also ``perm_median_draw``: the draw
    whose TVD is the row's median (the lower middle one of an even count), which
    :mod:`~attnaudit.interventions.sequence` re-decodes with. ``target`` is the
    :class:`Seq2SeqTarget` ``ref`` came from.
    """
    if n_permutations < 1:
        raise InterventionError(f"n_permutations must be a positive number of permutations "
                                f"per row, got {n_permutations}")
    rows = ref.rows() if rows is None else rows
    n_rows = len(rows)
    edit = _PermutationEdit(ref, rows, n_permutations)
    example = rows.example.repeat_interleave(n_permutations)
    step = rows.step.repeat_interleave(n_permutations)
    # run_items sorts items stably by step, so a row's permutations stay together and its
    # draws are made once, then served from the edit's cache (every site, next chunk).
    with progress_bar(len(example), "permutation", progress) as bar:
        change = run_items(target, ref, example, step, edit, chunk_size=chunk_size,
                           progress=bar)
    per_row = (n_rows, n_permutations)
    table = pd.DataFrame({
        **row_columns(ref, rows),
        "perm_median_tvd": median(change.tvd.reshape(per_row)).numpy(),
        "perm_median_jsd": median(change.jsd.reshape(per_row)).numpy(),
        "perm_flip_rate": change.flip.reshape(per_row).float().mean(-1).numpy(),
    })
    if median_draw:
        order = torch.argsort(change.tvd.reshape(per_row), dim=-1, stable=True)
        table["perm_median_draw"] = order[:, (n_permutations - 1) // 2].numpy()
    return table


def permutation_summary(per_row: pd.DataFrame) -> pd.DataFrame:
    """Median of ``perm_median_tvd`` in 4 equal-width bins of max_attention over [0, 1].

    Columns: bin (left edge), bin_right, n, median_perm_median_tvd (NaN only where n = 0),
    share_small_tvd (share of the bin's rows with median TVD < 0.05). A last row with
    bin "all" covers every row.
    """
    which = max_attention_bins(per_row["max_attention"])
    out = []
    for b, label in enumerate(BIN_LABELS):
        part = per_row.loc[which == label, "perm_median_tvd"]
        out.append(_bin_row(label, BIN_EDGES[b + 1], part))
    out.append(_bin_row("all", 1.0, per_row["perm_median_tvd"]))
    return pd.DataFrame(out)


BIN_EDGES = tuple(i / N_BINS for i in range(N_BINS + 1))
BIN_LABELS = tuple(f"{edge:.2f}" for edge in BIN_EDGES[:-1])  # each bin by its left edge


def max_attention_bins(max_attention: pd.Series) -> pd.Series:
    """Each row's bin of :func:`permutation_summary`, labelled as that table labels it
    (:data:`BIN_LABELS`, a categorical in bin order)."""
    return pd.cut(max_attention.clip(0.0, 1.0), list(BIN_EDGES), include_lowest=True,
                  labels=list(BIN_LABELS))


def _bin_row(label: str, right: float, part: pd.Series) -> dict[str, object]:
    return {"bin": label, "bin_right": right, "n": len(part),
            "median_perm_median_tvd": part.median() if len(part) else float("nan"),
            "share_small_tvd": (part < SMALL_TVD).mean() if len(part) else float("nan")}
