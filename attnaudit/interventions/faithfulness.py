"""Removal faithfulness of an importance ranking: ERASER comprehensiveness and sufficiency
(DeYoung et al. 2020) over removal bins, their AOPC and normalised AOPC (Edin et al. 2024)
(docs/metrics.md, "Faithfulness of the importance measures").

A row is one (example, step) of the reference run; the output quantity is the probability
``p`` of the audited token (the teacher-forced greedy output ``ref.emitted``) at that step.
For a ranking of the row's eligible source keys (``ref.eligible``, most important first) and
each removal fraction f in :data:`FRACTIONS` (percent), the top ``k_f`` keys
(:func:`bin_sizes`) are *removed*: their ids are replaced by one token (the leave-one-out
baseline, the pad token by default), positions, mask and length unchanged. Then

- comprehensiveness_f = p(full) - p(top k_f removed),
- sufficiency_f = p(full) - p(only the top k_f kept: every other eligible key removed),

with the decoder teacher-forced on the unedited greedy output. AOPC is the mean over the
bins. Normalised AOPC maps a row's AOPC onto [0, 1] between the lowest and the highest AOPC
over the orderings evaluated for the row (:func:`normalised`), an approximation of the
bounds over every ordering, which need a search.

Every edited source is one sequence; identical edited sources of one example (the same
removed set, from another step, ordering or bin) run once, and one teacher-forced pass
gives every step's probability. The unique edits run in chunks sized by the memory budget.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise

import torch

from attnaudit.errors import InterventionError
from attnaudit.interventions.edited_sources import EditedSourcePasses, first_changes
from attnaudit.interventions.memory import whole_passes
from attnaudit.interventions.reference_run import Reference, RowIndex
from attnaudit.interventions.runner import progress_bar
from attnaudit.targets.contract import Seq2SeqTarget

FRACTIONS = (1, 5, 10, 20, 50)  # removal fractions, percent of the row's eligible keys


def check_fractions(fractions: Sequence[float]) -> None:
    """An :class:`InterventionError` unless ``fractions`` are removal fractions: one or
    more numbers in (0, 100] (percent), increasing, no two the same (each is one bin of
    the curve, and AOPC is their mean)."""
    bad = [f for f in fractions if isinstance(f, bool) or not isinstance(f, (int, float))
           or not 0 < f <= 100]
    if bad or not len(fractions) or any(a >= b for a, b in pairwise(fractions)):
        raise InterventionError(f"removal fractions must be increasing, distinct percentages "
                                f"in (0, 100], at least one, got {tuple(fractions)!r}")


def bin_sizes(n_eligible: int, fractions: tuple[int, ...] = FRACTIONS) -> list[int]:
    """Keys removed per bin: ``ceil(f / 100 * n)``, at least 1, at most n."""
    check_fractions(fractions)
    return [min(n_eligible, max(1, math.ceil(f * n_eligible / 100))) for f in fractions]


def ranking(values: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    """(N, n) long: per row the eligible keys by decreasing value (ties: the earlier key
    first), then the ineligible ones. values (N, n) float, eligible (N, n) bool."""
    score = values.double().masked_fill(~eligible, -torch.inf)
    return torch.sort(score, dim=-1, descending=True, stable=True).indices


def reversed_ranking(order: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    """``order`` (N, n) with each row's eligible prefix reversed (the least important
    first); eligible (N, n) bool gives each row's prefix length."""
    out = order.clone()
    for i, count in enumerate(eligible.sum(-1).tolist()):
        out[i, :count] = order[i, :count].flip(0)
    return out


def random_ranking(eligible: torch.Tensor, seeds: list[int]) -> torch.Tensor:
    """(N, n) long: per row its eligible keys in a random order drawn with ``seeds[i]``
    (``torch.randperm`` on a CPU generator), then the ineligible ones."""
    rows = []
    for mask, seed in zip(eligible, seeds, strict=True):
        keys = mask.nonzero().squeeze(1)
        gen = torch.Generator().manual_seed(seed)
        shuffled = keys[torch.randperm(len(keys), generator=gen)]
        rows.append(torch.cat([shuffled, (~mask).nonzero().squeeze(1)]))
    return torch.stack(rows) if rows else torch.zeros(0, eligible.shape[-1], dtype=torch.long)


def row_seed(seed: int, example: int, step: int) -> int:
    """The random ranking's seed for a row: the target's seed and the row's global example
    and step (independent of batching)."""
    return (seed * 1_000_003 + example) * 10_007 + step


def row_removals(mask: torch.Tensor, orders: torch.Tensor,
                 fractions: tuple[int, ...] = FRACTIONS
                 ) -> Iterator[tuple[tuple[int, int, int], torch.Tensor]]:
    """The edited sources of one row: ``((ordering, bin, kind), removed)`` for each of the
    O orderings ``orders`` (O, n) and each bin, kind 0 removing the top ``k`` keys
    (comprehensiveness), kind 1 every other eligible key (sufficiency); ``removed`` (n,)
    bool. mask: (n,) bool, the row's eligible keys."""
    sizes = bin_sizes(int(mask.sum()), fractions)
    for o in range(orders.shape[0]):
        for f, k in enumerate(sizes):
            top = torch.zeros_like(mask)
            top[orders[o, :k]] = True
            yield (o, f, 0), top
            yield (o, f, 1), mask & ~top


def rows_within(rows: RowIndex, eligible: torch.Tensor, orders: torch.Tensor,
                budget: float | None, seeds: Sequence[int],
                fractions: tuple[int, ...] = FRACTIONS) -> torch.Tensor:
    """(K,) long, ascending: the rows measured under a budget of ``budget`` unique edited
    sources per example (None: every row). Each example's rows are taken in a random order
    drawn with its seed (``seeds``: one per row, read from the example's first row), as
    many as fit: a row whose edits not already run for the example would take the
    example past the budget ends that example's rows. eligible (N, n) bool, orders
    (N, O, n) long (:func:`ranking`)."""
    if budget is None:
        return torch.arange(len(rows))
    kept: list[int] = []
    for example in dict.fromkeys(rows.example.tolist()):
        members = (rows.example == example).nonzero().squeeze(1)
        gen = torch.Generator().manual_seed(seeds[int(members[0])])
        seen: set[bytes] = set()
        for i in members[torch.randperm(len(members), generator=gen)].tolist():
            new = {removed.numpy().tobytes()
                   for _, removed in row_removals(eligible[i], orders[i], fractions)} - seen
            if len(seen) + len(new) > budget:
                break
            seen |= new
            kept.append(i)
    return torch.tensor(sorted(kept), dtype=torch.long)


@dataclass(frozen=True)
class Curves:
    """Per row and ordering, the removal curves: comprehensiveness and sufficiency
    (N, O, F) float64, F = len(FRACTIONS); p_full (N,) the unedited probability."""

    comprehensiveness: torch.Tensor
    sufficiency: torch.Tensor
    p_full: torch.Tensor
    forward_sequences: int  # unique edited sources run


def removal_curves(target: Seq2SeqTarget, ref: Reference, rows: RowIndex,
                   orders: torch.Tensor, token: int, *,
                   fractions: tuple[int, ...] = FRACTIONS, chunk_size: int | None = None,
                   progress: bool = False) -> Curves:
    """Comprehensiveness and sufficiency of each ordering at each bin (module docstring).

    rows: N rows of ``ref``'s batch. orders: (N, O, n) long, O rankings per row
    (:func:`ranking`: eligible keys first). token: the id put in place of removed keys.
    chunk_size: edited sources per forward pass (default: from ``ref.budget``).
    """
    check_fractions(fractions)
    eligible = ref.eligible[rows.example, rows.step]  # (N, n)
    n_rows, n_orders = orders.shape[:2]
    edits: dict[tuple[int, bytes], int] = {}
    edit_rows: list[int] = []
    edit_masks: list[torch.Tensor] = []
    # (row, ordering, bin, kind 0 comprehensiveness / 1 sufficiency) -> edit index
    lookup = torch.zeros(n_rows, n_orders, len(fractions), 2, dtype=torch.long)

    def edit_of(example: int, removed: torch.Tensor) -> int:
        key = (example, removed.numpy().tobytes())
        if key not in edits:
            edits[key] = len(edit_rows)
            edit_rows.append(example)
            edit_masks.append(removed)
        return edits[key]

    for i in range(n_rows):
        example = int(rows.example[i])
        for (o, f, kind), removed in row_removals(eligible[i], orders[i], fractions):
            lookup[i, o, f, kind] = edit_of(example, removed)
    probs = _edited_probabilities(target, ref, edit_rows, edit_masks, token, chunk_size,
                                  progress)
    steps = rows.step[:, None, None, None].expand_as(lookup)
    edited = probs[lookup, steps]  # (N, O, F, 2)
    emitted = ref.emitted[rows.example, rows.step]
    p_full = ref.probs[rows.example, rows.step, emitted].double()
    drop = p_full[:, None, None, None] - edited
    return Curves(drop[..., 0], drop[..., 1], p_full, len(edit_rows))


def _edited_probabilities(target: Seq2SeqTarget, ref: Reference, edit_rows: list[int],
                          edit_masks: list[torch.Tensor], token: int,
                          chunk_size: int | None, progress: bool) -> torch.Tensor:
    """(E, T) float64: the teacher-forced probability of the emitted token at every step,
    for each edited source (example ``edit_rows[e]`` with ``edit_masks[e]`` replaced)."""
    n_steps, n_keys = ref.emitted.shape[1], ref.batch.source_ids.shape[1]
    if chunk_size is None:
        chunk_size = whole_passes(target, vocab=int(ref.probs.shape[-1]), keys=n_keys,
                                  steps=n_steps, max_memory=ref.budget.max_memory)
    out = torch.zeros(len(edit_rows), n_steps, dtype=torch.float64)
    if not edit_rows:
        return out
    masks = torch.stack(edit_masks)
    # by first removed key, so that a chunk's sources share the longest unedited prefix
    order = torch.argsort(first_changes(torch.zeros_like(masks), masks), stable=True)
    example, masks = torch.tensor(edit_rows)[order], masks[order]
    passes = EditedSourcePasses(target, ref.batch, ref.states)
    chunk_size = passes.chunk_size(len(edit_rows), chunk_size)
    with torch.no_grad(), progress_bar(len(edit_rows), "faithfulness", progress) as bar:
        for at in range(0, len(edit_rows), chunk_size):
            chunk = example[at : at + chunk_size]
            ids = ref.batch.source_ids[chunk.to(ref.batch.source_ids.device)].clone()
            ids[masks[at : at + chunk_size].to(ids.device)] = token
            emitted = ref.emitted[chunk]
            logits = passes.logits(chunk, ids, emitted.to(ids.device))
            probs = torch.softmax(logits.float(), -1)
            picked = probs.gather(-1, emitted.to(probs.device)[..., None]).squeeze(-1)
            out[order[at : at + len(chunk)]] = picked.double().cpu()
            bar.update(len(chunk))
    return out


def aopc(curve: torch.Tensor) -> torch.Tensor:
    """The area over the perturbation curve: the mean over the bins (last axis)."""
    return curve.mean(-1)


def normalised(values: torch.Tensor, higher_is_better: bool) -> torch.Tensor:
    """(N, O) AOPC -> (N, O) in [0, 1]: 1 for the best ordering of the row among the O,
    0 for the worst (NaN where every ordering scores the same). Comprehensiveness is
    better when higher, sufficiency when lower."""
    low = values.amin(-1, keepdim=True)
    high = values.amax(-1, keepdim=True)
    span = high - low
    share = (values - low) / span if higher_is_better else (high - values) / span
    return torch.where(span > 0, share, torch.full_like(share, torch.nan))
