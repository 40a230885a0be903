"""The batched primitive every intervention uses: a reference run, then edited re-runs.

Default seq2seq protocol (docs/metrics.md, "Output change"): teacher-force the model's own
greedy output, intervene at target step ``t`` only — the query row ``t`` of each selected
site — and compare ``p(. | y_<t, x)`` at step ``t`` before and after.

An *item* is one edited re-run of one ``(example, step)`` row: permutation ``r`` of a row,
candidate ``k``, removal of ``k`` keys... Items are folded into the batch dimension
(examples repeated with :meth:`Batch.select`), so one forward pass serves many
interventions; items are sorted by step and the emitted ids cut after the last step a chunk
needs, so a step-2 item does not pay for the steps after it. When the target exposes
``encode``/``decode`` and no edited site is called while encoding, each example is encoded
once, in the reference run, and edited re-runs only run the decoder.

Key-level view: cross-attention keys are source positions, shared by every selected site and
head. ``Reference.attention`` is the mean over the selected sites and their heads; the
interventions that pick keys (top key, removal orders) pick them on that mean and edit the
chosen keys at every selected site and head.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from attnaudit.capturing.recorder import capture
from attnaudit.errors import AttnauditError
from attnaudit.record import AttentionRecord, Site
from attnaudit.target import Batch, Seq2SeqTarget, select_state

# (site name, rows (m, H, n) at the edited step, item ids (m,)) -> new rows (m, H, n).
RowEdit = Callable[[str, torch.Tensor, torch.Tensor], torch.Tensor]

DEFAULT_CHUNK = 4096  # folded sequences per forward pass: bounds memory, keeps BLAS busy


class InterventionError(AttnauditError, ValueError):
    """An intervention cannot run on this target (no selectable sites, wrong shapes...)."""


@dataclass
class Reference:
    """The unedited run of one batch.

    batch: the B examples. emitted: greedy ids (B, T). steps: bool (B, T), steps up to and
    including the first end-of-sequence. probs: teacher-forced output probabilities
    (B, T, V). sites: the edited site names. weights: site -> reference weights
    (B, H, T, n), query row t = step t. eligible: bool (B, T, n), keys an intervention may
    move — eligible at every selected site and not a special token. first_example: index
    of the batch's first example in the audit data (seeds depend on it, not on batching).
    seed: the target's seed. encoded: the encoder state from ``target.encode`` when edited
    re-runs may reuse it, else None. head_index: the model's indices of the edited heads
    (the same at every edited site), or None for all heads; ``weights`` then holds only
    those heads, and the other heads run unedited.
    """

    batch: Batch
    emitted: torch.Tensor
    steps: torch.Tensor
    probs: torch.Tensor
    sites: tuple[str, ...]
    weights: dict[str, torch.Tensor]
    eligible: torch.Tensor
    first_example: int
    seed: int
    encoded: Any = None
    head_index: tuple[int, ...] | None = None

    @property
    def heads(self) -> dict[str, int]:
        return {name: int(w.shape[1]) for name, w in self.weights.items()}

    @property
    def head_offsets(self) -> dict[str, int]:
        """Where each site's heads start on the stacked site-head axis."""
        offsets, at = {}, 0
        for name in self.sites:
            offsets[name] = at
            at += self.heads[name]
        return offsets

    @property
    def n_site_heads(self) -> int:
        return sum(self.heads.values())

    @property
    def attention(self) -> torch.Tensor:
        """(B, T, n): reference weights averaged over the selected sites and heads."""
        stacked = torch.cat([self.weights[s] for s in self.sites], dim=1)
        return stacked.float().mean(1)

    @property
    def predicted(self) -> torch.Tensor:
        """(B, T): argmax of the reference output at each step."""
        return self.probs.argmax(-1)

    def rows(self) -> Rows:
        """Every (example, step) row within the step mask that has an eligible key."""
        valid = self.steps & self.eligible.any(-1)
        example, step = valid.nonzero(as_tuple=True)
        return Rows(example, step)


@dataclass(frozen=True)
class Rows:
    """N query rows: example (N,) long, local to the reference batch; step (N,) long."""

    example: torch.Tensor
    step: torch.Tensor

    def __len__(self) -> int:
        return int(self.example.shape[0])

    def select(self, index: torch.Tensor) -> Rows:
        return Rows(self.example[index], self.step[index])


def select_sites(records: dict[str, AttentionRecord], sites: Sequence[str] | None,
                 kind: str) -> tuple[str, ...]:
    """Names of the sites to edit: every site of ``kind``, or the requested names."""
    found = {name: rec.kind for name, rec in records.items()}
    if sites is None:
        chosen = [name for name, k in found.items() if k == kind]
        if not chosen:
            raise InterventionError(
                f"no {kind}-attention site found; sites and kinds seen: {found}. Declare kinds "
                "with Seq2SeqTarget(kinds={...}) or pass sites=[...]")
        return tuple(chosen)
    chosen = []
    for wanted in sites:
        match = [n for n in found if wanted in (n, n.split(":", 1)[0])]
        if not match:
            raise InterventionError(f"site {wanted!r} was not seen; sites seen: {list(found)}")
        chosen.extend(m for m in match if m not in chosen)
    return tuple(chosen)


def reference(target: Seq2SeqTarget, batch: Batch, *, sites: Sequence[str] | None = None,
              heads: Sequence[int] | None = None, kind: str = "cross",
              first_example: int = 0) -> Reference:
    """Greedy output, teacher-forced probabilities and reference weights for ``batch``.

    sites: the sites to edit (default every site of ``kind``); heads: edit only these
    heads at each of them (default all).
    """
    encoded, in_encoder = None, set()
    with torch.no_grad():
        emitted = target.greedy(batch)
        with capture(target.model, sites=target.sites, kinds=target.kinds) as cap:
            if target.encode is not None and target.decode is not None:
                encoded = target.encode(batch)
                in_encoder = set(cap.records)
                logits = target.decode(batch, encoded, emitted)
            else:
                logits = target.teacher_forced(batch, emitted)
    names = select_sites(cap.records, sites, kind)
    if in_encoder.intersection(names):
        encoded = None  # an edit there changes the encoder output: re-encode every copy
    n_examples, n_steps = emitted.shape
    n_keys = batch.source_ids.shape[1]
    weights, eligible = {}, target.explain_keys(batch)[:, None, :].expand(-1, n_steps, -1)
    for name in names:
        rec = cap.records[name]
        w = rec.weights
        if tuple(w.shape[:1]) + tuple(w.shape[2:]) != (n_examples, n_steps, n_keys):
            raise InterventionError(
                f"site {name!r} has weights {tuple(w.shape)}; interventions need one query row "
                f"per emitted step over the source keys: ({n_examples}, heads, {n_steps}, "
                f"{n_keys}). Only cross-attention sites run in teacher forcing qualify.")
        mask = rec.key_mask
        # A key mask may have one head or all of them (scores masked per head).
        mask = None if mask is None else mask.expand(w.shape)
        if heads is not None:
            _check_heads(name, heads, int(w.shape[1]))
            w = w[:, list(heads)]
            mask = None if mask is None else mask[:, list(heads)]
        weights[name] = w
        if mask is not None:
            eligible = eligible & mask.all(1)
    return Reference(batch=batch, emitted=emitted, steps=target.step_mask(emitted),
                     probs=torch.softmax(logits.float(), -1), sites=names, weights=weights,
                     eligible=eligible.contiguous(), first_example=first_example,
                     seed=target.seed, encoded=encoded,
                     head_index=None if heads is None else tuple(heads))


def _check_heads(site: str, heads: Sequence[int], n_heads: int) -> None:
    if not heads or len(set(heads)) != len(heads) or not all(0 <= h < n_heads for h in heads):
        raise InterventionError(f"heads {list(heads)} are not distinct head indices of site "
                                f"{site!r}, which has {n_heads} head(s)")


def edited_probs(target: Seq2SeqTarget, ref: Reference, example: torch.Tensor,
                 step: torch.Tensor, row_edit: RowEdit, items: torch.Tensor) -> torch.Tensor:
    """Output probabilities (m, V) at each item's own step, with ``row_edit`` applied there.

    example, step, items: (m,) long. Runs under the caller's grad mode, so gradients flow
    to whatever ``row_edit`` returns.
    """
    batch = ref.batch.select(example)
    emitted = ref.emitted[example, : int(step.max()) + 1]

    def edit(site: Site, weights: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        query = step - site.query_offset
        hit = ((query >= 0) & (query < weights.shape[2])).nonzero().squeeze(1)
        if hit.numel() == 0:
            return weights
        old = weights[hit, :, query[hit], :]  # (m, H, n)
        new = weights.clone()
        if ref.head_index is None:
            new[hit, :, query[hit], :] = row_edit(site.name, old, items[hit]).to(weights.dtype)
        else:
            chosen = list(ref.head_index)
            rows = old.clone()
            rows[:, chosen] = row_edit(site.name, old[:, chosen], items[hit]).to(weights.dtype)
            new[hit, :, query[hit], :] = rows
        return new

    with capture(target.model, sites=list(ref.sites), edit=edit, kinds=target.kinds):
        if ref.encoded is None:
            logits = target.teacher_forced(batch, emitted)
        else:
            assert target.decode is not None
            logits = target.decode(batch, select_state(ref.encoded, example), emitted)
    return torch.softmax(logits[torch.arange(len(step)), step].float(), -1)


def run_items(target: Seq2SeqTarget, ref: Reference, example: torch.Tensor,
              step: torch.Tensor, row_edit: RowEdit, *, chunk_size: int = DEFAULT_CHUNK,
              progress: tqdm | None = None) -> torch.Tensor:
    """Edited output probabilities (M, V) for M items, folded into chunks of forward passes.

    example, step: (M,) long; item i is passed to ``row_edit`` as id i.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    n_items = int(example.shape[0])
    out = torch.empty(n_items, ref.probs.shape[-1])
    order = torch.argsort(step, stable=True)
    with torch.no_grad():
        for at in range(0, n_items, chunk_size):
            idx = order[at : at + chunk_size]
            out[idx] = edited_probs(target, ref, example[idx], step[idx], row_edit, idx)
            if progress is not None:
                progress.update(len(idx))
    return out


def progress_bar(total: int, desc: str, enabled: bool) -> tqdm:
    """A tqdm bar over ``total`` edited sequences (silent when not ``enabled``)."""
    return tqdm(total=total, desc=desc, unit="seq", disable=not enabled, leave=False)


def row_generator(ref: Reference, example: int, step: int, salt: int) -> torch.Generator:
    """A generator seeded by (target seed, global example index, step, purpose), so each
    row's random draws do not depend on how the data was batched or chunked."""
    mixed = (ref.seed * 0x9E3779B1 + (ref.first_example + example) * 0x85EBCA77
             + step * 0xC2B2AE3D + salt * 0x27D4EB2F) % (2**63 - 1)
    return torch.Generator().manual_seed(mixed)


def site_head_rows(ref: Reference, site: str, per_head: torch.Tensor) -> torch.Tensor:
    """The slice of a (..., S*H, n) site-head tensor that belongs to ``site``: (..., H, n)."""
    at = ref.head_offsets[site]
    return per_head[..., at : at + ref.heads[site], :]


def row_probs(ref: Reference, rows: Rows) -> torch.Tensor:
    """Reference output probabilities (N, V) at each row's step."""
    return ref.probs[rows.example, rows.step]


def row_columns(ref: Reference, rows: Rows) -> dict[str, object]:
    """Identifying columns of a per-row table: example, step, n_valid, max_attention."""
    eligible = ref.eligible[rows.example, rows.step]
    attention = ref.attention[rows.example, rows.step].masked_fill(~eligible, 0.0)
    return {
        "example": (rows.example + ref.first_example).numpy(),
        "step": rows.step.numpy(),
        "n_valid": eligible.sum(-1).numpy(),
        "max_attention": attention.max(-1).values.numpy(),
    }


def key_level_top(ref: Reference, rows: Rows) -> torch.Tensor:
    """(N,) long: each row's top eligible key on the site-and-head mean attention."""
    attention = ref.attention[rows.example, rows.step]
    eligible = ref.eligible[rows.example, rows.step]
    return attention.masked_fill(~eligible, -1.0).argmax(-1)


def stacked_rows(ref: Reference, rows: Rows) -> torch.Tensor:
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
