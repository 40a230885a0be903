"""Adversarial attention (Jain & Wallace): distributions far from the original whose
output stays within ``eps`` TVD.

Per row, K candidates per selected site and head, parameterised by log-weights over the
eligible keys (keys that are not eligible keep their weight in place; the eligible mass is
redistributed), initialised at log-uniform + 3 * N(0, 1); Adam (lr 0.01, amsgrad) for 500
steps on

    loss = sum_k [ -JSD(a_k, a_orig) + lambda * relu(TVD_k - eps) ] - mean_{i<j} JSD(a_i, a_j)

with JSD between attention distributions averaged over the selected sites and heads.
``eps_max_jsd`` is the largest JSD(a_k, a_orig) among final candidates whose output TVD,
measured in a final forward pass, is at most eps (0 when none qualifies). Candidates fold
into the batch dimension: one forward and backward pass per optimisation step.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from attnaudit.errors import InterventionError
from attnaudit.interventions.draws import eligible_draws
from attnaudit.interventions.outputs import jsd, tvd
from attnaudit.interventions.reference_run import Reference, RowIndex
from attnaudit.interventions.runner import (
    edited_probs,
    progress_bar,
    row_columns,
    row_generator,
    site_head_rows,
    spread_over_eligible,
    stacked_rows,
)
from attnaudit.targets.contract import Seq2SeqTarget

CANDIDATES = 5
STEPS = 500
LEAST_ADVERSARIAL_STEPS = 100  # the fewest the suite runs under its work budget
LEARNING_RATE = 0.01
PENALTY = 500.0
EPS_SEQ2SEQ = 0.05
INIT_SCALE = 3.0
_SALT = 4


def _candidates(theta: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    """Log-weights (N, K, S*H, n) -> distributions over eligible keys (N, n)."""
    return torch.softmax(theta.masked_fill(~eligible[:, None, None, :], float("-inf")), -1)


def _distance(a: torch.Tensor, original: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    """(N, K): JSD between each candidate as the model uses it (in-place keys kept) and the
    original rows (N, S*H, n), averaged over sites and heads."""
    n_rows, k = a.shape[:2]
    flat = original.repeat_interleave(k, 0)
    used = spread_over_eligible(flat, eligible.repeat_interleave(k, 0), a.flatten(0, 1))
    return jsd(used, flat).mean(-1).reshape(n_rows, k)


def _pairwise_jsd(a: torch.Tensor) -> torch.Tensor:
    """(N, K, S*H, n) -> (N,) mean JSD over candidate pairs i < j (site-head mean)."""
    k = a.shape[1]
    i, j = torch.triu_indices(k, k, offset=1)
    if len(i) == 0:
        return a.new_zeros(a.shape[0])
    return jsd(a[:, i], a[:, j]).mean(-1).mean(-1)


def adversarial_search(target: Seq2SeqTarget, ref: Reference, rows: RowIndex | None = None, *,
                       candidates: int = CANDIDATES, steps: int = STEPS,
                       learning_rate: float = LEARNING_RATE, penalty: float = PENALTY,
                       eps: float = EPS_SEQ2SEQ, chunk_size: int | None = None,
                       progress: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per row: eps_max_jsd, n_within_eps (candidates with output TVD <= eps), min_tvd; and
    per final candidate: jsd_to_original, output_tvd.

    chunk_size: candidate sequences per forward and backward pass (default: from the
    reference's memory budget)."""
    if candidates < 1 or steps < 0 or eps < 0:
        raise InterventionError(f"adversarial_search needs candidates >= 1, steps >= 0 and "
                                f"eps >= 0; got candidates={candidates}, steps={steps}, "
                                f"eps={eps}")
    rows = ref.rows() if rows is None else rows
    if chunk_size is None:
        longest = int(rows.step.max()) if len(rows) else 0
        chunk_size = ref.budget.sequences(ref.positions(longest), grad=True)
    per_chunk = max(1, chunk_size // candidates)
    parts = []
    with progress_bar(len(rows) * candidates * steps, "adversarial", progress) as bar:
        for at in range(0, len(rows), per_chunk):
            chunk = rows.select(torch.arange(at, min(at + per_chunk, len(rows))))
            parts.append(_search_chunk(target, ref, chunk, candidates, steps, learning_rate,
                                       penalty, eps, bar))
    jsd_final = torch.cat([p[0] for p in parts])
    tvd_final = torch.cat([p[1] for p in parts])
    within = tvd_final <= eps
    per_row = pd.DataFrame({
        **row_columns(ref, rows),
        "eps_max_jsd": jsd_final.masked_fill(~within, 0.0).max(-1).values.numpy(),
        "n_within_eps": within.sum(-1).numpy(),
        "min_tvd": tvd_final.min(-1).values.numpy(),
    })
    ids = row_columns(ref, rows)
    per_candidate = pd.DataFrame({
        "example": np.asarray(ids["example"]).repeat(candidates),
        "step": np.asarray(ids["step"]).repeat(candidates),
        "candidate": torch.arange(candidates).repeat(len(rows)).numpy(),
        "jsd_to_original": jsd_final.reshape(-1).numpy(),
        "output_tvd": tvd_final.reshape(-1).numpy(),
    })
    return per_row, per_candidate


def _search_chunk(target: Seq2SeqTarget, ref: Reference, rows: RowIndex, k: int, steps: int,
                  lr: float, penalty: float, eps: float, bar
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Optimise one chunk of rows; return final JSD to the original and output TVD (N, K)."""
    n_rows = len(rows)
    eligible = ref.eligible[rows.example, rows.step]
    original = stacked_rows(ref, rows).float()  # (N, S*H, n)
    n_valid = eligible.sum(-1).clamp_min(1).float()
    noise = torch.stack([
        eligible_draws(torch.randn, row_generator(ref, int(e), int(s), _SALT),
                       (k, ref.n_site_heads), keys)
        for e, s, keys in zip(rows.example, rows.step, eligible, strict=True)])
    theta = (-torch.log(n_valid)[:, None, None, None] + INIT_SCALE * noise).requires_grad_(True)
    optimiser = torch.optim.Adam([theta], lr=lr, amsgrad=True)
    before = ref.probs[rows.example, rows.step].repeat_interleave(k, 0)
    example, step = rows.example.repeat_interleave(k), rows.step.repeat_interleave(k)
    items = torch.arange(n_rows * k)

    def run(a: torch.Tensor) -> torch.Tensor:
        flat = a.reshape(n_rows * k, *a.shape[2:])
        item_eligible = eligible.repeat_interleave(k, 0)

        def edit(site: str, old: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
            return spread_over_eligible(old, item_eligible[ids],
                                        site_head_rows(ref, site, flat[ids]))

        probs = edited_probs(target, ref, example, step, edit, items)
        return tvd(before, probs).reshape(n_rows, k)

    for _ in range(steps):
        with torch.enable_grad():
            a = _candidates(theta, eligible)
            change = run(a)
            away = _distance(a, original, eligible)
            loss = (-away + penalty * torch.relu(change - eps)).sum(-1) - _pairwise_jsd(a)
            # autograd.grad, not backward(): only the path to theta is differentiated and
            # the model's parameters never receive a .grad.
            (theta.grad,) = torch.autograd.grad(loss.sum(), [theta])
        optimiser.step()
        bar.update(n_rows * k)
    with torch.no_grad():
        a = _candidates(theta, eligible)
        change = run(a)
        away = _distance(a, original, eligible)
    return away, change

