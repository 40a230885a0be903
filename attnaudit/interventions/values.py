"""Value replacement at the top-weighted key, and at a random one: does that position's
content matter?

A site's output is ``sum_j w_j v_j``, so two controls are exact weight edits:
- ``zero``: v_j -> 0 is w_j -> 0 without renormalising (the edit the contributions layer's
  value zeroing also makes);
- ``mean``: v_j -> mean of the eligible values is w_j -> w_j / n_valid, with
  w_j / n_valid added to every other eligible key.
Each runs at the top key (``value_zero_*``, ``value_mean_*``; chosen on the site-and-head
mean attention) and at a seeded random other eligible key (``value_zero_random_*``,
``value_mean_random_*``: the key the single zeroing test's ``zero_random`` draws; NaN on a
row without one), at every selected site and head. The third control, ``other_example``
(another example's value at the same position), is no weight edit: that value is not a
mixture of the row's own values, so it needs the value vectors replaced inside the forward
pass, which capture's edit path does not do; it is reported as not reachable rather than
approximated.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from attnaudit.interventions.ablation import random_other_key
from attnaudit.interventions.reference_run import Reference, RowIndex
from attnaudit.interventions.runner import (
    ItemEdit,
    OutputChange,
    key_level_top,
    progress_bar,
    row_columns,
    run_items,
)
from attnaudit.targets.contract import Seq2SeqTarget

NOT_REACHABLE = ("another example's value is not a mixture of the row's own values, so no "
                 "weight edit reads it (zero and mean are exact weight edits); capture's edit "
                 "path replaces weights, not the value vectors inside the forward pass")


def zero_value(old: torch.Tensor, top: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    """Rows (m, H, n) reading a zero value at key ``top`` (m,)."""
    del eligible  # same signature as mean_value
    return old.scatter(-1, top[:, None, None].expand(-1, old.shape[1], 1), 0.0)


def mean_value(old: torch.Tensor, top: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    """Rows (m, H, n) reading the mean of the eligible values (m, n) at key ``top`` (m,)."""
    w_top = old.gather(-1, top[:, None, None].expand(-1, old.shape[1], 1))  # (m, H, 1)
    share = eligible[:, None, :].to(old.dtype) / eligible.sum(-1)[:, None, None].clamp_min(1)
    return zero_value(old, top, eligible) + w_top * share


CONTROLS = ("zero", "mean")  # the weight-edit controls


def _control_rows(old: torch.Tensor, key: torch.Tensor, eligible: torch.Tensor,
                  is_mean: torch.Tensor) -> torch.Tensor:
    """Rows (m, H, n) of items reading the mean value (``is_mean`` (m,)) or a zero value at
    ``key`` (m,)."""
    return torch.where(is_mean[:, None, None], mean_value(old, key, eligible),
                       zero_value(old, key, eligible))


def value_replacement(target: Seq2SeqTarget, ref: Reference, rows: RowIndex | None = None, *,
                      chunk_size: int | None = None,
                      progress: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per row: value_{zero,mean}_{tvd,jsd,flip} at the top key and
    value_{zero,mean}_random_{tvd,jsd,flip} at the random key (NaN on a row without one);
    and one status row per control (zero, mean, zero_random, mean_random, other_example).

    The status table has columns control, status ("run" or "not reachable"), reason, n,
    tvd_mean, flip_rate (NaN only for controls that were not run).
    """
    rows = ref.rows() if rows is None else rows
    top = key_level_top(ref, rows)
    other = random_other_key(ref, rows, top)
    has_other = (other >= 0).nonzero().squeeze(1)
    eligible = ref.eligible[rows.example, rows.step]
    columns: dict[str, object] = dict(row_columns(ref, rows))
    status = []
    # one pass for all four controls: items are blocks (top, random) x (zero, mean)
    blocks = [(control + suffix, at, keys) for suffix, at, keys in (
        ("", torch.arange(len(rows)), top), ("_random", has_other, other[has_other]))
        for control in CONTROLS]
    item_row = torch.cat([at for _, at, _ in blocks])
    item_key = torch.cat([keys for _, _, keys in blocks])
    is_mean = torch.cat([torch.full((len(at),), name.startswith("mean"))
                         for name, at, _ in blocks])
    with progress_bar(len(item_row), "values", progress) as bar:
        change = run_items(target, ref, rows.example[item_row], rows.step[item_row],
                           ItemEdit(_control_rows, item_key, eligible[item_row], is_mean),
                           chunk_size=chunk_size, progress=bar)
    first = 0
    for name, at, _ in blocks:
        part = change.select(slice(first, first + len(at)))
        first += len(at)
        columns |= _spread(f"value_{name}", part, at, len(rows))
        status.append({"control": name, "status": "run", "reason": "exact weight edit",
                       "n": len(at),
                       "tvd_mean": float(part.tvd.mean()) if len(at) else float("nan"),
                       "flip_rate": float(part.flip.float().mean()) if len(at)
                       else float("nan")})
    status.append({"control": "other_example", "status": "not reachable",
                   "reason": NOT_REACHABLE, "n": 0, "tvd_mean": float("nan"),
                   "flip_rate": float("nan")})
    return pd.DataFrame(columns), pd.DataFrame(status)


def _spread(prefix: str, change: OutputChange, at: torch.Tensor, n_rows: int
            ) -> dict[str, object]:
    """``{prefix}_{tvd,jsd,flip}`` over all ``n_rows`` rows, the items at rows ``at``; NaN
    on the other rows (flips then an object column of True / False / NaN)."""
    tvd, jsd = torch.full((n_rows,), float("nan")), torch.full((n_rows,), float("nan"))
    tvd[at], jsd[at] = change.tvd, change.jsd
    if len(at) == n_rows:
        flips: object = change.flip.numpy()
    else:
        flips = np.full(n_rows, np.nan, dtype=object)
        flips[at.numpy()] = change.flip.numpy()
    return {f"{prefix}_tvd": tvd.numpy(), f"{prefix}_jsd": jsd.numpy(), f"{prefix}_flip": flips}


def merge_controls(controls: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """One row per control over all batches (the per-batch status rows of
    :func:`value_replacement` re-aggregated; ``tvd_mean`` and ``flip_rate`` from the suite's
    per-row table ``rows``)."""
    out = []
    for control, group in controls.groupby("control", sort=False):
        first = group.iloc[0]
        ran = first["status"] == "run"
        out.append({"control": control, "status": first["status"], "reason": first["reason"],
                    "n": int(group["n"].sum()),
                    "tvd_mean": rows[f"value_{control}_tvd"].mean() if ran else float("nan"),
                    "flip_rate": pd.to_numeric(rows[f"value_{control}_flip"], errors="coerce")
                    .astype(float).mean() if ran else float("nan")})
    return pd.DataFrame(out)
