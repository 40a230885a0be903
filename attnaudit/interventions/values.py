"""Value replacement at the top-weighted key: does that position's content matter?

A site's output is ``sum_j w_j v_j``, so two controls are exact weight edits:
- ``zero``: v_top -> 0 is w_top -> 0 without renormalising;
- ``mean``: v_top -> mean of the eligible values is w_top -> w_top / n_valid, with
  w_top / n_valid added to every other eligible key.
The third control, ``other_example`` (another example's value at the same position), needs
the value vectors themselves inside the forward pass; capture's edits replace weights only,
so it is reported as not reachable rather than approximated. The top key is chosen on the
site-and-head mean attention and replaced at every selected site and head.
"""

from __future__ import annotations

import pandas as pd
import torch

from attnaudit.interventions.reference_run import Reference, RowIndex
from attnaudit.interventions.runner import (
    ItemEdit,
    key_level_top,
    progress_bar,
    row_columns,
    run_items,
)
from attnaudit.targets.contract import Seq2SeqTarget

NOT_REACHABLE = ("capture edits replace weights, not value vectors; another example's value "
                 "is not a weight edit")


def zero_value(old: torch.Tensor, top: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    """Rows (m, H, n) reading a zero value at key ``top`` (m,)."""
    del eligible  # same signature as mean_value
    return old.scatter(-1, top[:, None, None].expand(-1, old.shape[1], 1), 0.0)


def mean_value(old: torch.Tensor, top: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    """Rows (m, H, n) reading the mean of the eligible values (m, n) at key ``top`` (m,)."""
    w_top = old.gather(-1, top[:, None, None].expand(-1, old.shape[1], 1))  # (m, H, 1)
    share = eligible[:, None, :].to(old.dtype) / eligible.sum(-1)[:, None, None].clamp_min(1)
    return zero_value(old, top, eligible) + w_top * share


def value_replacement(target: Seq2SeqTarget, ref: Reference, rows: RowIndex | None = None, *,
                      chunk_size: int | None = None,
                      progress: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per row: value_{zero,mean}_{tvd,jsd,flip}; and one status row per control.

    The status table has columns control, status ("run" or "not reachable"), reason, n,
    tvd_mean, flip_rate (NaN only for controls that were not run).
    """
    rows = ref.rows() if rows is None else rows
    top = key_level_top(ref, rows)
    eligible = ref.eligible[rows.example, rows.step]
    columns: dict[str, object] = dict(row_columns(ref, rows))
    status = []
    with progress_bar(2 * len(rows), "values", progress) as bar:
        for name, fn in (("zero", zero_value), ("mean", mean_value)):
            change = run_items(target, ref, rows.example, rows.step,
                               ItemEdit(fn, top, eligible), chunk_size=chunk_size,
                               progress=bar)
            columns |= {f"value_{name}_tvd": change.tvd.numpy(),
                        f"value_{name}_jsd": change.jsd.numpy(),
                        f"value_{name}_flip": change.flip.numpy()}
            status.append({"control": name, "status": "run", "reason": "exact weight edit",
                           "n": len(rows), "tvd_mean": float(change.tvd.mean()),
                           "flip_rate": float(change.flip.float().mean())})
    status.append({"control": "other_example", "status": "not reachable",
                   "reason": NOT_REACHABLE, "n": 0, "tvd_mean": float("nan"),
                   "flip_rate": float("nan")})
    return pd.DataFrame(columns), pd.DataFrame(status)


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
                    "flip_rate": rows[f"value_{control}_flip"].mean() if ran else float("nan")})
    return pd.DataFrame(out)
