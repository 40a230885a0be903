"""The batched primitive every intervention uses: edited re-runs of a reference run
(:mod:`attnaudit.interventions.reference_run`), and the per-row helpers they share.

Default seq2seq protocol (docs/metrics.md, "Output change"): teacher-force the model's own
greedy output, intervene at target step ``t`` only — the query row ``t`` of each selected
site — and compare ``p(. | y_<t, x)`` at step ``t`` before and after.

An *item* is one edited re-run of one ``(example, step)`` row: permutation ``r`` of a row,
candidate ``k``, removal of ``k`` keys... An item edits the row's weights (a
:data:`RowEdit`, such as :class:`ItemEdit`) or, where capture holds the values
(``Reference.value_sites``), what the row reads from them (an :class:`ItemRead`). Items are
folded into the batch dimension
(examples repeated with :meth:`Batch.select`), so one forward pass serves many
interventions. How an item runs depends on what the target offers:

- *one cached step* (``encode`` + ``decode_states`` + ``decode_step``): the edit at step
  ``t`` changes nothing before ``t``, so the item starts from the reference run's unedited
  decoder state before ``t`` (a KV cache, a recurrent state) and runs one decoder step;
- *decoder re-run* (``encode`` + ``decode``): the decoder re-runs the prefix ``0..t`` from
  the example's cached encoder state;
- *full re-run* (``teacher_forced`` only, or an edited site inside the encoder).

Only the edited step's output distribution is kept, compared with the reference's at once
(:class:`OutputChange`); chunk sizes come from a memory budget (:mod:`.memory`), so the peak
memory depends on the budget, not on the vocabulary or the number of examples.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from attnaudit.capturing.protocol import ValueEdit
from attnaudit.capturing.recorder import Edit, capture
from attnaudit.errors import InterventionError
from attnaudit.interventions.outputs import changes
from attnaudit.interventions.reference_run import Reference, RowIndex
from attnaudit.record import Site
from attnaudit.runtime.progress import Counter
from attnaudit.targets.contract import Seq2SeqTarget, select_state

# (site name, rows (m, H, n) at the edited step, item ids (m,)) -> new rows (m, H, n).
RowEdit = Callable[[str, torch.Tensor, torch.Tensor], torch.Tensor]


class ItemRead:
    """A value edit of each item's row that reads per-item tensors:
    ``fn(site name, weight rows (m, H, n), value rows (m, H, n, d_v), *[t[items] for t in
    tensors])`` -> the rows' reads (m, H, d_v), which replace ``sum_j w_j v_j`` there.

    Every tensor has the item axis first. Rows come as float32 on the CPU, the edited heads
    only (``Reference.head_index``); it runs only at ``Reference.value_sites``.
    """

    def __init__(self, fn: Callable[..., torch.Tensor], *tensors: torch.Tensor) -> None:
        self.fn, self.tensors = fn, tensors

    def __call__(self, site: str, weights: torch.Tensor, values: torch.Tensor,
                 items: torch.Tensor) -> torch.Tensor:
        return self.fn(site, weights, values, *(t[items] for t in self.tensors))


@dataclass(frozen=True)
class OutputChange:
    """Per edited item, its step's output distribution against the reference's.

    tvd, jsd: (M,) float32. flip: (M,) bool, the argmax changed.
    """

    tvd: torch.Tensor
    jsd: torch.Tensor
    flip: torch.Tensor

    def select(self, index: torch.Tensor | slice) -> OutputChange:
        return OutputChange(self.tvd[index], self.jsd[index], self.flip[index])



def _hit_rows(site: Site, query_row: torch.Tensor, n_queries: int, device: torch.device
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The sequences whose query row ``query_row`` (m,) lies in this call of ``n_queries``
    rows: their indices (CPU, and on ``device``) and their rows in the call; None if none."""
    query = query_row - site.query_offset
    hit = ((query >= 0) & (query < n_queries)).nonzero().squeeze(1)
    if hit.numel() == 0:
        return None
    return hit, hit.to(device), query[hit].to(device)


def _capture_edits(ref: Reference, query_row: torch.Tensor, row_edit: RowEdit | ItemRead,
                   items: torch.Tensor) -> tuple[Edit | None, ValueEdit | None]:
    """Capture's ``edit`` (for a :data:`RowEdit`) or ``value_edit`` (for an
    :class:`ItemRead`) applying ``row_edit`` at each sequence's query row ``query_row`` (m,)
    of the run (the step in a re-run, 0 in a one-step run). ``row_edit`` sees float32 CPU
    rows; what it returns goes back in the model's dtype and device."""
    chosen = slice(None) if ref.head_index is None else list(ref.head_index)
    if isinstance(row_edit, ItemRead):
        read_edit = row_edit

        def value_edit(site: Site, weights: torch.Tensor, values: torch.Tensor
                       ) -> torch.Tensor | None:
            hit = _hit_rows(site, query_row, weights.shape[2], weights.device)
            if hit is None:
                return None
            hit_cpu, at, rows_at = hit
            read = torch.matmul(weights, values)  # (B, H, Q, d_v)
            edited = read_edit(site.name, weights[at, :, rows_at, :][:, chosen].float().cpu(),
                               values[at][:, chosen].float().cpu(), items[hit_cpu])
            rows = read[at, :, rows_at, :]  # (m, H, d_v), a copy
            rows[:, chosen] = edited.to(device=read.device, dtype=read.dtype)
            read[at, :, rows_at, :] = rows
            return read

        return None, value_edit
    weight_edit = row_edit

    def edit(site: Site, weights: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        hit = _hit_rows(site, query_row, weights.shape[2], weights.device)
        if hit is None:
            return weights
        hit_cpu, at, rows_at = hit
        old = weights[at, :, rows_at, :]  # (m, H, n)
        edited = weight_edit(site.name, old[:, chosen].float().cpu(), items[hit_cpu])
        rows = old.clone()
        rows[:, chosen] = edited.to(device=weights.device, dtype=weights.dtype)
        new = weights.clone()
        new[at, :, rows_at, :] = rows
        return new

    return edit, None


def edited_probs(target: Seq2SeqTarget, ref: Reference, example: torch.Tensor,
                 step: torch.Tensor, row_edit: RowEdit | ItemRead, items: torch.Tensor
                 ) -> torch.Tensor:
    """Output probabilities (m, V) float32 on the CPU at each item's own step, with
    ``row_edit`` applied there.

    example, step, items: (m,) long. Runs under the caller's grad mode, so gradients flow
    to whatever ``row_edit`` returns.
    """
    if ref.states is None:
        return _rerun_probs(target, ref, example, step, row_edit, items)
    group = ref.call_group(step)
    groups = torch.unique(group).tolist()
    if len(groups) == 1:  # a chunk of run_items: one call, no (m, V) copies to reorder
        return _one_step_probs(target, ref, example, step, row_edit, items)
    parts, where = [], []
    for g in groups:
        at = (group == g).nonzero().squeeze(1)
        parts.append(_one_step_probs(target, ref, example[at], step[at], row_edit, items[at]))
        where.append(at)
    return torch.cat(parts)[torch.argsort(torch.cat(where))]


def _rerun_probs(target: Seq2SeqTarget, ref: Reference, example: torch.Tensor,
                 step: torch.Tensor, row_edit: RowEdit | ItemRead, items: torch.Tensor
                 ) -> torch.Tensor:
    batch = ref.batch.select(example)
    emitted = ref.emitted[example, : int(step.max()) + 1]
    edit, value_edit = _capture_edits(ref, step, row_edit, items)
    with capture(target.model, sites=list(ref.sites), edit=edit, value_edit=value_edit,
                 kinds=target.kinds):
        if ref.encoded is None:
            logits = target.teacher_forced(batch, emitted)
        else:
            assert target.decode is not None
            logits = target.decode(batch, select_state(ref.encoded, example), emitted)
        # only the edited step's distribution leaves the forward pass
        logits = logits[torch.arange(len(step)), step.to(logits.device)]
    return torch.softmax(logits.float(), -1).cpu()


def _one_step_probs(target: Seq2SeqTarget, ref: Reference, example: torch.Tensor,
                    step: torch.Tensor, row_edit: RowEdit | ItemRead, items: torch.Tensor
                    ) -> torch.Tensor:
    """Output probabilities (m, V) of one cached call: every item at one step
    (``decode_step``), or at their own steps (``decode_steps``, one
    :meth:`Reference.call_group`)."""
    edit, value_edit = _capture_edits(ref, torch.zeros_like(example), row_edit, items)
    parts = (ref.batch.select(example), select_state(ref.encoded, example),
             select_state(ref.states, example), ref.emitted[example])
    with capture(target.model, sites=list(ref.sites), edit=edit, value_edit=value_edit,
                 kinds=target.kinds):
        if bool((step != step[0]).any()):
            assert ref.mixed_steps and target.decode_steps is not None
            logits = target.decode_steps(*parts, step)
        else:
            assert target.decode_step is not None
            logits = target.decode_step(*parts, int(step[0]))
    if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != (len(example),
                                                                        ref.probs.shape[-1]):
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits)
        raise InterventionError(f"target {target.name!r}: decode_step must return logits of "
                                f"shape (sequences, vocab) = ({len(example)}, "
                                f"{ref.probs.shape[-1]}), got {got}")
    return torch.softmax(logits.float(), -1).cpu()


def item_chunks(ref: Reference, step: torch.Tensor, chunk_size: int | None = None, *,
                grad: bool = False) -> Iterator[torch.Tensor]:
    """Item indices (into ``step`` (M,)) in chunks of one forward pass each, in step order.

    A chunk holds at most ``chunk_size`` items, or by default as many as the reference's
    budget allows for the positions its last item runs (``grad``: with a backward pass);
    items running one cached step are chunked per step, unless the reference's cached
    call takes items at different steps (one :meth:`Reference.call_group` per chunk).
    """
    if chunk_size is not None and chunk_size < 1:
        raise InterventionError(f"chunk_size must be a positive number of edited sequences, "
                                f"got {chunk_size}; leave it None to size chunks from the "
                                "memory budget")
    order = torch.argsort(step, stable=True)
    ordered = step[order].tolist()
    group = ref.call_group(step[order]).tolist()
    at, n_items = 0, len(ordered)

    def fits(last: int) -> int:
        if chunk_size is not None:
            return chunk_size
        return ref.budget.sequences(ref.positions(ordered[last]), grad=grad)

    while at < n_items:
        end = min(at + fits(at), n_items)
        while end - at > fits(end - 1):  # later items run more positions
            end = at + fits(end - 1)
        if ref.states is not None:
            end = at + sum(1 for g in group[at:end] if g == group[at])
        yield order[at:end]
        at = end


def run_items(target: Seq2SeqTarget, ref: Reference, example: torch.Tensor,
              step: torch.Tensor, row_edit: RowEdit | ItemRead, *,
              chunk_size: int | None = None,
              progress: Counter | None = None) -> OutputChange:
    """How each of M edited items changes its step's output distribution, in chunks.

    example, step: (M,) long; item i is passed to ``row_edit`` as id i. chunk_size: items
    per forward pass (default: from the reference's memory budget). Only per-item numbers
    are kept, never the distributions.
    """
    n_items = int(example.shape[0])
    change = OutputChange(torch.empty(n_items), torch.empty(n_items),
                          torch.empty(n_items, dtype=torch.bool))
    with torch.no_grad():
        for idx in item_chunks(ref, step, chunk_size):
            before = ref.probs[example[idx], step[idx]]
            after = edited_probs(target, ref, example[idx], step[idx], row_edit, idx)
            change.tvd[idx], change.jsd[idx], change.flip[idx] = changes(before, after)
            if progress is not None:
                progress.update(len(idx))
    return change


def progress_bar(total: int, desc: str, enabled: bool) -> Counter:
    """A count of ``total`` edited sequences in the open progress display
    (:mod:`attnaudit.runtime.progress`; silent when not ``enabled``)."""
    return Counter(total, desc, enabled)


def row_generator(ref: Reference, example: int, step: int, salt: int) -> torch.Generator:
    """A generator seeded by (target seed, global example index, step, purpose), so each
    row's random draws do not depend on how the data was batched or chunked."""
    return seeded_generator(ref.seed, ref.first_example + example, step, salt)


def seeded_picks(ref: Reference, rows: RowIndex, candidates: torch.Tensor, salt: int
                 ) -> torch.Tensor:
    """(N,) long: per row one index drawn uniformly from its True ``candidates`` (N, C) with
    :func:`row_generator` (``salt``: the draw's purpose); -1 for a row without one."""
    picks = []
    for i in range(len(rows)):
        choices = candidates[i].nonzero().squeeze(1)
        if choices.numel() == 0:
            picks.append(-1)
            continue
        gen = row_generator(ref, int(rows.example[i]), int(rows.step[i]), salt)
        picks.append(int(choices[torch.randint(choices.numel(), (1,), generator=gen)]))
    return torch.tensor(picks, dtype=torch.long)


def seeded_generator(seed: int, example: int, step: int, salt: int) -> torch.Generator:
    """A CPU generator seeded by (seed, global example index, step, purpose)."""
    mixed = (seed * 0x9E3779B1 + example * 0x85EBCA77 + step * 0xC2B2AE3D
             + salt * 0x27D4EB2F) % (2**63 - 1)
    return torch.Generator().manual_seed(mixed)


def site_head_rows(ref: Reference, site: str, per_head: torch.Tensor) -> torch.Tensor:
    """The slice of a (..., S*H, n) site-head tensor that belongs to ``site``: (..., H, n)."""
    at = ref.head_offsets[site]
    return per_head[..., at : at + ref.heads[site], :]


def row_columns(ref: Reference, rows: RowIndex) -> dict[str, object]:
    """Identifying columns of a per-row table: example, step, n_valid, max_attention."""
    eligible = ref.eligible[rows.example, rows.step]
    attention = ref.attention[rows.example, rows.step].masked_fill(~eligible, 0.0)
    return {
        "example": (rows.example + ref.first_example).numpy(),
        "step": rows.step.numpy(),
        "n_valid": eligible.sum(-1).numpy(),
        "max_attention": attention.max(-1).values.numpy(),
    }


def key_level_top(ref: Reference, rows: RowIndex) -> torch.Tensor:
    """(N,) long: each row's top eligible key on the site-and-head mean attention."""
    attention = ref.attention[rows.example, rows.step]
    eligible = ref.eligible[rows.example, rows.step]
    return attention.masked_fill(~eligible, -1.0).argmax(-1)


def stacked_rows(ref: Reference, rows: RowIndex) -> torch.Tensor:
    """Reference weights of every selected site and head at each row: (N, S*H, n)."""
    return torch.cat([ref.weights[s][rows.example, :, rows.step, :] for s in ref.sites], dim=1)


class ItemEdit:
    """A row edit that reads per-item tensors: ``fn(old rows, *[t[items] for t in tensors])``.

    Every tensor has the item axis first; ``fn`` maps rows (m, H, n) to new rows.
    """

    def __init__(self, fn: Callable[..., torch.Tensor], *tensors: torch.Tensor) -> None:
        self.fn, self.tensors = fn, tensors

    def __call__(self, site: str, old: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        return self.fn(old, *(t[items] for t in self.tensors))


def spread_over_eligible(old: torch.Tensor, eligible: torch.Tensor,
                         eligible_weights: torch.Tensor) -> torch.Tensor:
    """Rows whose eligible keys get ``eligible_weights`` (summing to 1 over eligible keys,
    broadcastable to old (m, H, n)) scaled to the row's eligible mass; every other key keeps
    its weight in place."""
    keep = ~eligible[:, None, :]
    mass = old.masked_fill(keep, 0.0).sum(-1, keepdim=True)
    return torch.where(keep, old, mass * eligible_weights)
