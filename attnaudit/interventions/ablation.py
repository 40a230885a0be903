"""Uniform weights (Wiegreffe & Pinter) and zeroing (Serrano & Smith), single and cumulative.

Keys are chosen on the site-and-head mean attention (``Reference.attention``) and edited at
every selected site and head. Uniform is the paper's: ``1 / n_valid`` on every eligible key
and 0 on every other (padding, special tokens such as source ``</s>``); the variant
``uniform_mass`` spreads only the row's eligible mass evenly and leaves the weight on
ineligible keys in place. Zeroing sets the chosen weights to 0 and renormalises (L1) the rest
of the row; a row left with no mass at all gets uniform weight over its remaining eligible
keys.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from attnaudit.interventions.draws import eligible_draws
from attnaudit.interventions.reference_run import Reference, RowIndex
from attnaudit.interventions.runner import (
    ItemEdit,
    OutputChange,
    edited_probs,
    item_chunks,
    key_level_top,
    progress_bar,
    row_columns,
    row_generator,
    run_items,
    seeded_picks,
    spread_over_eligible,
    stacked_rows,
)
from attnaudit.targets.contract import Seq2SeqTarget

RANDOM_DRAWS = 5
ORDERS = ("attention", "random", "gradient", "attention_x_gradient")
_SALT_ZERO, _SALT_ORDER = 2, 3
REMOVAL_ROUND = 4  # removal counts tried per round of the cumulative test


def uniform_rows(old: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    """Rows (m, H, n) with ``1 / n_valid`` on each eligible key (m, n) and 0 on every other
    key (Wiegreffe & Pinter 2019); a row without an eligible key is left as it is."""
    return torch.where(eligible.any(-1)[:, None, None], _even(eligible, old.dtype), old)


def uniform_mass_rows(old: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    """The variant: rows (m, H, n) with the row's eligible mass spread evenly over the
    eligible keys (m, n); ineligible keys keep their weight."""
    return spread_over_eligible(old, eligible, _even(eligible, old.dtype))


def _even(eligible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(m, 1, n): ``1 / n_valid`` on each eligible key of ``eligible`` (m, n), 0 elsewhere."""
    share = eligible.to(dtype) / eligible.sum(-1, keepdim=True).clamp_min(1)
    return share[:, None, :]


def remove_keys(old: torch.Tensor, remove: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    """Zero the keys in ``remove`` (m, n) and renormalise the rest of rows (m, H, n).

    Rows left without mass get uniform weight over their remaining eligible keys.
    """
    kept = old.masked_fill(remove[:, None, :], 0.0)
    mass = kept.sum(-1, keepdim=True)
    rest = (eligible & ~remove)[:, None, :].to(old.dtype)
    fallback = rest / rest.sum(-1, keepdim=True).clamp_min(1)
    return torch.where(mass > 0, kept / mass.clamp_min(torch.finfo(old.dtype).tiny), fallback)


def _columns(prefix: str, change: OutputChange) -> dict[str, object]:
    return {f"{prefix}_tvd": change.tvd.numpy(), f"{prefix}_jsd": change.jsd.numpy(),
            f"{prefix}_flip": change.flip.numpy()}


def uniform_test(target: Seq2SeqTarget, ref: Reference, rows: RowIndex | None = None, *,
                 chunk_size: int | None = None, progress: bool = False) -> pd.DataFrame:
    """Per row: ``uniform_{tvd,jsd,flip}`` (the paper's 1/n_valid on eligible keys, 0 on the
    rest) and the variant's ``uniform_mass_{tvd,jsd,flip}`` (:func:`uniform_mass_rows`)."""
    rows = ref.rows() if rows is None else rows
    eligible = ref.eligible[rows.example, rows.step].repeat_interleave(2, 0)
    variant = torch.arange(2 * len(rows)) % 2 == 1  # items: row * 2 + (0 paper, 1 variant)

    def both(old: torch.Tensor, keys: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
        return torch.where(mass[:, None, None], uniform_mass_rows(old, keys),
                           uniform_rows(old, keys))

    with progress_bar(2 * len(rows), "uniform", progress) as bar:
        change = run_items(target, ref, rows.example.repeat_interleave(2),
                           rows.step.repeat_interleave(2), ItemEdit(both, eligible, variant),
                           chunk_size=chunk_size, progress=bar)
    return pd.DataFrame({**row_columns(ref, rows),
                         **_columns("uniform", change.select(slice(0, None, 2))),
                         **_columns("uniform_mass", change.select(slice(1, None, 2)))})


def random_other_key(ref: Reference, rows: RowIndex, top: torch.Tensor) -> torch.Tensor:
    """(N,) long: per row a seeded random eligible key other than ``top`` (-1 if none)."""
    eligible = ref.eligible[rows.example, rows.step].clone()
    eligible[torch.arange(len(rows)), top] = False
    return seeded_picks(ref, rows, eligible, _SALT_ZERO)


def zeroing_test(target: Seq2SeqTarget, ref: Reference, rows: RowIndex | None = None, *,
                 chunk_size: int | None = None, progress: bool = False) -> pd.DataFrame:
    """Single zeroing test: the top key vs a random non-top eligible key, per row.

    Columns: zero_top_{tvd,jsd,flip}, zero_random_{tvd,jsd,flip}, zero_weight_difference
    (mean attention on the top key minus on the random key). Rows with one eligible key
    have no random alternative and are left out.
    """
    rows = ref.rows() if rows is None else rows
    top = key_level_top(ref, rows)
    other = random_other_key(ref, rows, top)
    keep = other >= 0
    rows, top, other = rows.select(keep), top[keep], other[keep]
    n_rows, n_keys = len(rows), ref.eligible.shape[-1]
    chosen = torch.stack([top, other], dim=1).reshape(-1)  # items: row * 2 + (0 top, 1 random)
    remove = torch.zeros(2 * n_rows, n_keys, dtype=torch.bool)
    remove[torch.arange(2 * n_rows), chosen] = True
    eligible = ref.eligible[rows.example, rows.step].repeat_interleave(2, 0)
    edit = ItemEdit(remove_keys, remove, eligible)
    with progress_bar(2 * n_rows, "zeroing", progress) as bar:
        change = run_items(target, ref, rows.example.repeat_interleave(2),
                           rows.step.repeat_interleave(2), edit, chunk_size=chunk_size,
                           progress=bar)
    attention = ref.attention[rows.example, rows.step]
    index = torch.arange(n_rows)
    return pd.DataFrame({
        **row_columns(ref, rows),
        **_columns("zero_top", change.select(slice(0, None, 2))),
        **_columns("zero_random", change.select(slice(1, None, 2))),
        "zero_weight_difference": (attention[index, top] - attention[index, other]).numpy(),
    })


def zeroing_flip_table(per_row: pd.DataFrame) -> pd.DataFrame:
    """The 2x2 table of flips: columns zero_top_flip, zero_random_flip, n (all 4 cells)."""
    cells = [{"zero_top_flip": a, "zero_random_flip": b,
              "n": int(((per_row["zero_top_flip"] == a) & (per_row["zero_random_flip"] == b))
                       .sum())}
             for a in (True, False) for b in (True, False)]
    return pd.DataFrame(cells)


def weight_gradients(target: Seq2SeqTarget, ref: Reference, rows: RowIndex, *,
                     chunk_size: int | None = None) -> torch.Tensor:
    """d p(yhat_t) / d alpha: (N, S*H, n), the gradient of the predicted token's probability
    at step t with respect to each selected site's weights at step t (model unchanged)."""
    grads = torch.zeros(len(rows), ref.n_site_heads, ref.eligible.shape[-1])
    offsets, heads = ref.head_offsets, ref.heads
    predicted = ref.predicted[rows.example, rows.step]
    for idx in item_chunks(ref, rows.step, chunk_size, grad=True):
        leaves: list[tuple[str, torch.Tensor, torch.Tensor]] = []

        def as_leaf(site: str, old: torch.Tensor, items: torch.Tensor,
                    leaves: list = leaves) -> torch.Tensor:
            leaf = old.detach().clone().requires_grad_(True)
            leaves.append((site, leaf, items))
            return leaf

        with torch.enable_grad():
            probs = edited_probs(target, ref, rows.example[idx], rows.step[idx], as_leaf,
                                 torch.arange(len(idx)))
            chosen = probs[torch.arange(len(idx)), predicted[idx]]
            if not chosen.requires_grad:  # the output does not read the edited weights
                continue
            found = torch.autograd.grad(chosen.sum(), [leaf for _, leaf, _ in leaves],
                                        allow_unused=True)
        for (site, leaf, items), grad in zip(leaves, found, strict=True):
            at_site = slice(offsets[site], offsets[site] + heads[site])
            grads[idx[items], at_site] = torch.zeros_like(leaf) if grad is None else grad
    return grads


def removal_orders(target: Seq2SeqTarget, ref: Reference, rows: RowIndex, *,
                   random_draws: int = RANDOM_DRAWS,
                   chunk_size: int | None = None) -> dict[str, torch.Tensor]:
    """Order name -> key scores (N, n); keys are removed from the highest score down.

    Names: attention, random_1..random_D, gradient, attention_x_gradient (key-level scores
    are sums over the selected sites and heads).
    """
    attention = ref.attention[rows.example, rows.step]
    grads = weight_gradients(target, ref, rows, chunk_size=chunk_size)
    alpha = stacked_rows(ref, rows).float()
    scores = {"attention": attention}
    eligible = ref.eligible[rows.example, rows.step]
    noise = torch.stack([
        eligible_draws(torch.rand, row_generator(ref, int(e), int(s), _SALT_ORDER),
                       (random_draws,), keys)
        for e, s, keys in zip(rows.example, rows.step, eligible, strict=True)])
    for d in range(random_draws):
        scores[f"random_{d + 1}"] = noise[:, d]
    scores["gradient"] = grads.sum(1)
    scores["attention_x_gradient"] = (alpha * grads).sum(1)
    return scores


def cumulative_test(target: Seq2SeqTarget, ref: Reference, rows: RowIndex | None = None, *,
                    random_draws: int = RANDOM_DRAWS, chunk_size: int | None = None,
                    progress: bool = False) -> pd.DataFrame:
    """Remove keys in each order until the argmax flips (at most n_valid - 1 keys).

    One DataFrame row per (row, order): example, step, n_valid, order (attention, random,
    gradient, attention_x_gradient), draw (1..D for random, else 1), flipped,
    keys_removed, frac_keys (keys removed / n_valid) and frac_mass (mean attention removed /
    mean attention on eligible keys) at the first flip; NaN where the row never flipped.
    """
    rows = ref.rows() if rows is None else rows
    scores = removal_orders(target, ref, rows, random_draws=random_draws, chunk_size=chunk_size)
    names = list(scores)
    eligible = ref.eligible[rows.example, rows.step]
    n_valid = eligible.sum(-1)
    stacked = torch.stack([scores[n].masked_fill(~eligible, float("-inf")) for n in names], 1)
    rank = torch.argsort(torch.argsort(stacked, dim=-1, descending=True, stable=True), dim=-1)
    n_rows, n_orders = len(rows), len(names)
    flipped_at = torch.zeros(n_rows, n_orders, dtype=torch.long)
    tried = torch.zeros(n_rows, n_orders, dtype=torch.long)
    never = torch.iinfo(torch.long).max
    with progress_bar(0, "cumulative", progress) as bar:
        while True:
            pending = (flipped_at == 0) & (tried < (n_valid - 1)[:, None])
            if not pending.any():
                break
            row, order = pending.nonzero(as_tuple=True)
            done = tried[row, order]
            counts = torch.minimum(done + REMOVAL_ROUND, n_valid[row] - 1) - done
            pair = torch.arange(len(row)).repeat_interleave(counts)  # item -> pending pair
            item_row = row[pair]
            k = done[pair] + _offsets_within(counts) + 1
            remove = (rank[item_row, order[pair]] < k[:, None]) & eligible[item_row]
            bar.total += len(k)
            change = run_items(target, ref, rows.example[item_row], rows.step[item_row],
                               ItemEdit(remove_keys, remove, eligible[item_row]),
                               chunk_size=chunk_size, progress=bar)
            hit_k = torch.where(change.flip, k, never)
            first = torch.full((len(row),), never).scatter_reduce(0, pair, hit_k, "amin")
            flipped_at[row, order] = torch.where(first == never, 0, first)
            tried[row, order] += counts
    return _cumulative_frame(ref, rows, names, flipped_at, rank, eligible)


def _offsets_within(counts: torch.Tensor) -> torch.Tensor:
    """0, 1, ..., c-1 for each count c, concatenated."""
    starts = torch.cumsum(counts, 0) - counts
    return torch.arange(int(counts.sum())) - starts.repeat_interleave(counts)


def _cumulative_frame(ref: Reference, rows: RowIndex, names: list[str], flipped_at: torch.Tensor,
                      rank: torch.Tensor, eligible: torch.Tensor) -> pd.DataFrame:
    attention = ref.attention[rows.example, rows.step].masked_fill(~eligible, 0.0)
    ids = row_columns(ref, rows)
    frames = []
    for o, name in enumerate(names):
        k = flipped_at[:, o]
        removed = (rank[:, o] < k[:, None]) & eligible
        flipped = (k > 0).numpy()
        frac_keys = (k / eligible.sum(-1)).numpy()
        frac_mass = ((attention * removed).sum(-1) / attention.sum(-1).clamp_min(1e-30)).numpy()
        family, _, draw = name.partition("_") if name.startswith("random_") else (name, "", "1")
        frames.append(pd.DataFrame({
            "example": ids["example"], "step": ids["step"], "n_valid": ids["n_valid"],
            "order": family, "draw": int(draw), "flipped": flipped,
            "keys_removed": k.numpy(),
            "frac_keys": _nan_unless(frac_keys, flipped),
            "frac_mass": _nan_unless(frac_mass, flipped),
        }))
    return pd.concat(frames, ignore_index=True)


def _nan_unless(values: np.ndarray, keep: np.ndarray) -> np.ndarray:
    out = values.astype(float).copy()
    out[~keep] = float("nan")
    return out


def cumulative_summary(per_row: pd.DataFrame) -> pd.DataFrame:
    """Per order: n (row-draws), n_flipped, never_flipped, and over flipped rows only the
    mean and median of frac_keys and frac_mass (NaN only when n_flipped = 0)."""
    out = []
    for order in ORDERS:
        part = per_row[per_row["order"] == order]
        hit = part[part["flipped"]]
        out.append({"order": order, "n": len(part), "n_flipped": len(hit),
                    "never_flipped": len(part) - len(hit),
                    "frac_keys_mean": hit["frac_keys"].mean(),
                    "frac_keys_median": hit["frac_keys"].median(),
                    "frac_mass_mean": hit["frac_mass"].mean(),
                    "frac_mass_median": hit["frac_mass"].median()})
    return pd.DataFrame(out)
