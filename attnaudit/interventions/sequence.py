"""Sequence-level effects: does the returned text change when an edit is held while decoding?

The per-row protocols measure one step's output distribution under teacher forcing. A user
of a translation model asks something else: whether the text the model returns changes.
Here each edit is held at *every* decoding step, at every edited site and head (cross-
attention keys are source positions, the same at every step), the source is decoded again
with the target's own decoding (``target.greedy``: the same settings, beams and seed), and
the returned output is compared with the unedited one, token by token up to and including
its end of sequence:

- ``uniform``: ``1 / n_valid`` on every eligible key, 0 on the rest; one re-decoding
  per example (``step`` is -1: the edit is no row's own);
- ``zero_top`` / ``zero_random``: per row, the key the single zeroing test zeroes there
  (its top key on the site-and-head mean; a seeded random other eligible key), zeroed and
  the rest renormalised at every step; rows without a random alternative are left out, as
  in the zeroing test;
- ``perm_median``: per row, the permutation draw whose output TVD is the row's median (the
  lower middle one of an even count), applied at every step.

Per re-decoding: ``exact_match`` (the same tokens) and ``edit_distance`` (Levenshtein
distance over token ids: insertions, deletions and substitutions), with both lengths.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import torch

from attnaudit.capturing.recorder import capture
from attnaudit.errors import InterventionError
from attnaudit.interventions.ablation import random_other_key, remove_keys, uniform_rows
from attnaudit.interventions.permutation import _PermutationEdit
from attnaudit.interventions.reference_run import Reference, RowIndex
from attnaudit.interventions.runner import ItemEdit, RowEdit, key_level_top, progress_bar
from attnaudit.record import Site
from attnaudit.runtime.progress import Counter
from attnaudit.targets.contract import Seq2SeqTarget

SEQUENCE_PROTOCOLS = ("uniform", "zero_top", "zero_random", "perm_median")
SEQUENCE_COLUMNS = ["example", "step", "protocol", "exact_match", "edit_distance", "length",
                    "edited_length"]


def edit_distance(a: list[int], b: list[int]) -> int:
    """Levenshtein distance between two token sequences (unit costs)."""
    if not a or not b:
        return max(len(a), len(b))
    left, right = np.asarray(a), np.asarray(b)
    previous = np.arange(len(right) + 1)
    for i, token in enumerate(left, start=1):
        substituted = previous[:-1] + (right != token)
        current = np.empty_like(previous)
        current[0] = i
        current[1:] = np.minimum(substituted, previous[1:] + 1)
        # an insertion depends on the cell to its left: a running minimum along the row
        current = np.minimum.accumulate(current - np.arange(len(current))) + np.arange(
            len(current))
        previous = current
    return int(previous[-1])


def sequence_effects(target: Seq2SeqTarget, ref: Reference, rows: RowIndex, *,
                     perm_median_draw: np.ndarray | None = None, n_permutations: int = 0,
                     progress: bool = False) -> pd.DataFrame:
    """The sequence-level table (module docstring) for ``rows`` of one reference batch.

    perm_median_draw: (N,) per row the permutation draw to hold (the permutation test's
    ``perm_median_draw`` column, drawn with ``n_permutations`` per row); None leaves the
    ``perm_median`` protocol out.
    """
    jobs = [_uniform_job(ref, rows), *_zeroing_jobs(ref, rows)]
    if perm_median_draw is not None:
        draws = torch.as_tensor(np.array(perm_median_draw, dtype=np.int64))
        edit = _PermutationEdit(ref, rows, n_permutations)
        jobs.append(("perm_median", rows.example, rows.step,
                     edit, torch.arange(len(rows)) * n_permutations + draws))
    total = sum(len(job[1]) for job in jobs)
    frames = []
    with progress_bar(total, "sequence effects", progress) as bar:
        for protocol, example, step, row_edit, items in jobs:
            frames.append(_redecode(target, ref, protocol, example, step, row_edit, items, bar))
    return pd.concat(frames, ignore_index=True)


_Job = tuple[str, torch.Tensor, torch.Tensor, RowEdit, torch.Tensor]


def _uniform_job(ref: Reference, rows: RowIndex) -> _Job:
    """One item per example with a counted row, on its first counted row's eligible keys."""
    example, first = np.unique(rows.example.numpy(), return_index=True)
    at = torch.as_tensor(first, dtype=torch.long)
    eligible = ref.eligible[rows.example[at], rows.step[at]]
    return ("uniform", torch.as_tensor(example, dtype=torch.long),
            torch.full((len(example),), -1, dtype=torch.long),
            ItemEdit(uniform_rows, eligible), torch.arange(len(example)))


def _zeroing_jobs(ref: Reference, rows: RowIndex) -> list[_Job]:
    """zero_top and zero_random: the single zeroing test's keys, per row."""
    top = key_level_top(ref, rows)
    other = random_other_key(ref, rows, top)
    keep = other >= 0
    rows, top, other = rows.select(keep), top[keep], other[keep]
    eligible = ref.eligible[rows.example, rows.step]
    jobs: list[_Job] = []
    for protocol, keys in (("zero_top", top), ("zero_random", other)):
        remove = torch.zeros_like(eligible)
        remove[torch.arange(len(rows)), keys] = True
        jobs.append((protocol, rows.example, rows.step, ItemEdit(remove_keys, remove, eligible),
                     torch.arange(len(rows))))
    return jobs


def _redecode(target: Seq2SeqTarget, ref: Reference, protocol: str, example: torch.Tensor,
              step: torch.Tensor, row_edit: RowEdit, items: torch.Tensor,
              bar: Counter) -> pd.DataFrame:
    """Decode each item's example again with its edit held; compare with the reference."""
    beams = target.decoding.num_beams if target.decoding is not None else 1
    chunk = max(1, ref.budget.sequences(int(ref.emitted.shape[1])) // beams)
    unedited = ref.emitted.cpu()
    found: list[dict[str, object]] = []
    for start in range(0, len(example), chunk):
        at = slice(start, start + chunk)
        editor = _held_editor(ref, row_edit, items[at])
        with torch.no_grad(), capture(target.model, sites=list(ref.sites), edit=editor,
                                      kinds=target.kinds):
            edited = target.greedy(ref.batch.select(example[at])).cpu()
        kept = target.step_mask(edited)
        for i, (e, s) in enumerate(zip(example[at].tolist(), step[at].tolist(), strict=True)):
            before = unedited[e][ref.steps[e]].tolist()
            after = edited[i][kept[i]].tolist()
            found.append({"example": e + ref.first_example, "step": s, "protocol": protocol,
                          "exact_match": before == after,
                          "edit_distance": edit_distance(before, after),
                          "length": len(before), "edited_length": len(after)})
        bar.update(len(example[at]))
    return pd.DataFrame(found, columns=SEQUENCE_COLUMNS)


def _held_editor(ref: Reference, row_edit: RowEdit, items: torch.Tensor
                 ) -> Callable[[Site, torch.Tensor, torch.Tensor | None], torch.Tensor]:
    """A capture edit applying ``row_edit`` to every query row of every call, sequence ``r``
    of a call being item ``items[r // (rows / len(items))]`` (beam slots follow their
    item). ``row_edit`` sees float32 CPU rows, as in the per-row protocols."""
    chosen = slice(None) if ref.head_index is None else list(ref.head_index)

    def edit(site: Site, weights: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        n_rows, _, queries, keys = weights.shape
        if n_rows % len(items) or keys != ref.eligible.shape[-1]:
            raise InterventionError(
                f"site {site.name!r}: a decoding call with weights {tuple(weights.shape)} "
                f"does not hold {len(items)} sequences' rows over the {ref.eligible.shape[-1]} "
                "source keys; sequence effects hold edits over source keys, at "
                "cross-attention sites only")
        per_item = items.repeat_interleave(n_rows // len(items)).repeat_interleave(queries)
        old = weights[:, chosen].transpose(1, 2)  # (rows, Q, H', n)
        flat = old.reshape(n_rows * queries, *old.shape[2:]).float().cpu()
        new = row_edit(site.name, flat, per_item).reshape(old.shape).transpose(1, 2)
        out = weights.clone()
        out[:, chosen] = new.to(device=weights.device, dtype=weights.dtype)
        return out

    return edit
