"""Value replacement at the top-weighted key, and at a random one: does that position's
content matter?

A site's output is ``sum_j w_j v_j``, so two controls are exact weight edits:
- ``zero``: v_j -> 0 is w_j -> 0 without renormalising (the edit the contributions layer's
  value zeroing also makes);
- ``mean``: v_j -> mean of the eligible values is w_j -> w_j / n_valid, with
  w_j / n_valid added to every other eligible key.
The third control, ``other_example``, replaces v_j by another example's value at the same
position. That value is no mixture of the row's own values, so it is a value edit
(``capture(value_edit=)``): the edited row reads ``sum_i w_i v'_i`` with ``v'_j`` the
donor's value, the row's weights as the model computes them. The donor rule:
- the donor is another example of the same batch (the examples the reference ran
  together), drawn uniformly with a generator seeded by (target seed, the row's global
  example index, step, purpose) — salt 6 at the top key, 7 at the random key — among the
  examples whose key ``j`` is eligible at the same step (length-compatible: the position
  exists in the donor's source and may be attended there); a row with no such example
  gets NaN. The draw depends on which examples share the batch; no values are kept from
  other batches (the pool is the batch, so memory does not grow with the audit);
- the value is the donor's own, unedited value vector at key position ``j`` in the same
  site (layer) and head; with grouped-query attention, its key/value head's (the value
  every query head of the group reads).
It needs the values inside the forward pass, which capture holds on the explicit
``F.scaled_dot_product_attention`` path and on ``nn.MultiheadAttention``'s Python path
(``Reference.value_sites``), and at a decoder-only model's prompt view of either: there
``j`` is a prompt position of the left-padded batch, and the step's row reads the donor's
value at ``j`` among the call's keys, the cached prefix's included — the value the cache
holds at ``j`` replaced for that step only, the cache itself unchanged, so a one-step run
from the cached prefix and a prefix re-run agree. At any other site (the softmax path: the
model's own code multiplies the weights with the values, as in the date LSTM or Hugging
Face's ``eager`` backend; taps) it is reported as not reachable, with each site's reason,
never approximated; zero and mean stay exact weight edits there. The donor values come
from one extra forward pass of the donor examples (one decoder position), read through a
value edit that changes nothing.
Each control runs at the top key (``value_{zero,mean,other_example}_*``; chosen on the
site-and-head mean attention) and at a seeded random other eligible key
(``value_{zero,mean,other_example}_random_*``: the key the single zeroing test's
``zero_random`` draws; NaN on a row without one), at every selected site and head.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import torch

from attnaudit.capturing.recorder import capture
from attnaudit.interventions.ablation import random_other_key
from attnaudit.interventions.reference_run import Reference, RowIndex
from attnaudit.interventions.runner import (
    ItemEdit,
    ItemRead,
    OutputChange,
    key_level_top,
    progress_bar,
    row_columns,
    run_items,
    seeded_picks,
)
from attnaudit.record import Site
from attnaudit.targets.contract import Seq2SeqTarget, select_state

_SALT_DONOR, _SALT_DONOR_RANDOM = 6, 7
WEIGHT_EDIT = "exact weight edit"
VALUE_EDIT = ("value edit: the key's value replaced by a seeded other example's value at the "
              "same position, site and head")
# Why a site's values are out of a value edit's reach, by capture mechanism.
NO_VALUES = {
    "softmax": "capture sees only the softmax's output; the model's own code multiplies it "
               "with the values",
    "tap": "attnaudit.tap() hands capture the weights only",
}


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


def unreachable(ref: Reference) -> str | None:
    """Why the other-example control cannot run on ``ref``'s edited sites, site by site;
    None when capture holds the values at every one of them."""
    missing = [s for s in ref.sites if s not in ref.value_sites]
    if not missing:
        return None
    why = "; ".join(f"{s} ({ref.mechanisms.get(s, '?')}): "
                    + NO_VALUES.get(ref.mechanisms.get(s, ""),
                                    "capture does not hold the values there") for s in missing)
    return (f"another example's value is no mixture of the row's own values, so it needs a "
            f"value edit, and capture holds no values at {len(missing)} of {len(ref.sites)} "
            f"edited site(s): {why}")


def donor_examples(ref: Reference, rows: RowIndex, key: torch.Tensor, salt: int
                   ) -> torch.Tensor:
    """(N,) long, local to the batch: per row a seeded random other example whose key
    ``key`` (N,) is eligible at the row's step (-1 if none; see the module docstring)."""
    fits = ref.eligible[:, rows.step, key].T.clone()  # (N, B)
    fits[torch.arange(len(rows)), rows.example] = False
    return seeded_picks(ref, rows, fits, salt)


def other_example_items(ref: Reference, rows: RowIndex, top: torch.Tensor,
                        other: torch.Tensor) -> list[tuple[str, torch.Tensor, torch.Tensor,
                                                            torch.Tensor]]:
    """The other-example items: per control (``other_example`` at ``top``,
    ``other_example_random`` at ``other``, -1 for none), the rows that run (into ``rows``),
    their keys and their donors."""
    blocks = []
    for name, keys, salt in (("other_example", top, _SALT_DONOR),
                             ("other_example_random", other, _SALT_DONOR_RANDOM)):
        has_key = (keys >= 0).nonzero().squeeze(1)
        donor = torch.full((len(rows),), -1, dtype=torch.long)
        donor[has_key] = donor_examples(ref, rows.select(has_key), keys[has_key], salt)
        at = (donor >= 0).nonzero().squeeze(1)
        blocks.append((name, at, keys[at], donor[at]))
    return blocks


def donor_values(target: Seq2SeqTarget, ref: Reference, donor: torch.Tensor,
                 key: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per value site, the donors' values at their keys: (M, H, d_v) float32 on the CPU
    (the edited heads), from one forward pass of the donor examples (one decoder position;
    a cross-attention site's values depend on the source only)."""
    used, where = torch.unique(donor, return_inverse=True)
    chosen = slice(None) if ref.head_index is None else list(ref.head_index)
    kept: dict[str, torch.Tensor] = {}

    def keep(site: Site, weights: torch.Tensor, values: torch.Tensor) -> None:
        if site.name not in kept:
            kept[site.name] = values[:, chosen][where, :, key].float().cpu()

    batch, emitted = ref.batch.select(used), ref.emitted[used, :1]
    # the values as a value edit sees them (a prompt view's are the view's keys'), read only
    with torch.no_grad(), capture(target.model, sites=list(ref.value_sites), keep=False,
                                  value_edit=keep, kinds=target.kinds):
        if ref.encoded is None:
            target.teacher_forced(batch, emitted)
        else:
            assert target.decode is not None
            target.decode(batch, select_state(ref.encoded, used), emitted)
    return kept


def _other_example_read(donors: dict[str, torch.Tensor]) -> Callable[..., torch.Tensor]:
    """An :class:`ItemRead` function: each item's row reads its own values with key
    ``key`` holding the donor's value ``donors[site][item]``."""

    def read(site: str, weights: torch.Tensor, values: torch.Tensor, key: torch.Tensor,
             item: torch.Tensor) -> torch.Tensor:
        replaced = values.clone()  # (m, H, n, d_v)
        replaced[torch.arange(len(key)), :, key] = donors[site][item]
        return torch.einsum("mhn,mhnd->mhd", weights, replaced)

    return read


def value_replacement(target: Seq2SeqTarget, ref: Reference, rows: RowIndex | None = None, *,
                      chunk_size: int | None = None,
                      progress: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per row: value_{zero,mean,other_example}_{tvd,jsd,flip} at the top key and
    value_{zero,mean,other_example}_random_{tvd,jsd,flip} at the random key (NaN on a row
    without one, or without a donor, or everywhere when the other-example control is not
    reachable), value_other_example{,_random}_donor (the donor's global example index, -1
    for none); and one status row per control (zero, mean, zero_random, mean_random,
    other_example, other_example_random).

    The status table has columns control, status ("run" or "not reachable"), reason, n,
    tvd_mean, flip_rate (NaN only for controls that were not run).
    """
    rows = ref.rows() if rows is None else rows
    top = key_level_top(ref, rows)
    other = random_other_key(ref, rows, top)
    has_other = (other >= 0).nonzero().squeeze(1)
    eligible = ref.eligible[rows.example, rows.step]
    columns: dict[str, object] = dict(row_columns(ref, rows))
    # one pass for the four weight edits: items are blocks (top, random) x (zero, mean)
    blocks = [(control + suffix, at, keys) for suffix, at, keys in (
        ("", torch.arange(len(rows)), top), ("_random", has_other, other[has_other]))
        for control in CONTROLS]
    item_row = torch.cat([at for _, at, _ in blocks])
    item_key = torch.cat([keys for _, _, keys in blocks])
    is_mean = torch.cat([torch.full((len(at),), name.startswith("mean"))
                         for name, at, _ in blocks])
    reason = unreachable(ref)
    others = [] if reason is not None else other_example_items(ref, rows, top, other)
    other_row = torch.cat([at for _, at, _, _ in others]) if others else item_row[:0]
    other_change = _NO_CHANGE
    with progress_bar(len(item_row) + len(other_row), "values", progress) as bar:
        change = run_items(target, ref, rows.example[item_row], rows.step[item_row],
                           ItemEdit(_control_rows, item_key, eligible[item_row], is_mean),
                           chunk_size=chunk_size, progress=bar)
        if len(other_row):
            donor_key = torch.cat([k for _, _, k, _ in others])
            donors = donor_values(target, ref, torch.cat([d for _, _, _, d in others]),
                                  donor_key)
            other_change = run_items(
                target, ref, rows.example[other_row], rows.step[other_row],
                ItemRead(_other_example_read(donors), donor_key, torch.arange(len(other_row))),
                chunk_size=chunk_size, progress=bar)
    status = []
    parts = [(name, at, change, WEIGHT_EDIT) for name, at, _ in blocks]
    parts += [(name, at, other_change, VALUE_EDIT) for name, at, _, _ in others]
    for name, at, _, donor in others:
        columns[f"value_{name}_donor"] = _donor_column(ref, at, donor, len(rows))
    first = {WEIGHT_EDIT: 0, VALUE_EDIT: 0}
    for name, at, ran, how in parts:
        part = ran.select(slice(first[how], first[how] + len(at)))
        first[how] += len(at)
        columns |= _spread(f"value_{name}", part, at, len(rows))
        status.append({"control": name, "status": "run", "reason": how, "n": len(at),
                       "tvd_mean": float(part.tvd.mean()) if len(at) else float("nan"),
                       "flip_rate": float(part.flip.float().mean()) if len(at)
                       else float("nan")})
    if reason is not None:
        for name in ("other_example", "other_example_random"):
            columns |= _spread(f"value_{name}", _NO_CHANGE, torch.arange(0), len(rows))
            columns[f"value_{name}_donor"] = np.full(len(rows), -1)
            status.append({"control": name, "status": "not reachable", "reason": reason,
                           "n": 0, "tvd_mean": float("nan"), "flip_rate": float("nan")})
    return pd.DataFrame(columns), pd.DataFrame(status)


def _donor_column(ref: Reference, at: torch.Tensor, donor: torch.Tensor, n_rows: int
                  ) -> np.ndarray:
    """(n_rows,) the donors' global example indices at rows ``at``, -1 elsewhere."""
    out = np.full(n_rows, -1)
    out[at.numpy()] = donor.numpy() + ref.first_example
    return out


_NO_CHANGE = OutputChange(torch.empty(0), torch.empty(0), torch.empty(0, dtype=torch.bool))


def _spread(prefix: str, change: OutputChange, at: torch.Tensor, n_rows: int
            ) -> dict[str, object]:
    """``{prefix}_{tvd,jsd,flip}`` over all ``n_rows`` rows, the items at rows ``at``; NaN
    on the other rows (flips then an object column of True / False / NaN)."""
    tvd, jsd = torch.full((n_rows,), float("nan")), torch.full((n_rows,), float("nan"))
    tvd[at], jsd[at] = change.tvd, change.jsd
    if len(at) == n_rows:
        flips: object = change.flip.numpy()
    elif not len(at):  # no row ran: NaN, a float column as a CSV reads it back
        flips = np.full(n_rows, np.nan)
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
