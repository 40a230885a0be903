"""The unedited run every intervention starts from: a batch's greedy output, teacher-forced
probabilities and the reference weights of the sites to edit (:func:`reference`).

Key-level view: cross-attention keys are source positions, shared by every selected site and
head. ``Reference.attention`` is the mean over the selected sites and their heads; the
interventions that pick keys (top key, removal orders) pick them on that mean and edit the
chosen keys at every selected site and head. The query rows interventions run on are
picked by index (:class:`RowIndex`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from attnaudit.analysis.cached_decoding import logits_tvd, step_tolerance
from attnaudit.analysis.degenerate import negligible_rows, row_reasons
from attnaudit.capturing.recorder import capture
from attnaudit.errors import InterventionError, TargetError
from attnaudit.interventions.memory import ChunkBudget, encoder_bytes, tensor_bytes
from attnaudit.record import AttentionRecord
from attnaudit.runtime.measurement import timed
from attnaudit.targets.contract import Batch, Seq2SeqTarget, select_state

# What a target raises when its cached step cannot be taken, so the prefix is re-run:
# TargetError (attnaudit's Hugging Face targets, attnaudit.targets.hf.cache: a recurrent or
# hybrid cache that cannot go back to an earlier position, a model that returns no cache)
# and NotImplementedError (a target's own code saying it has no such step).
CACHE_REFUSALS = (TargetError, NotImplementedError)


@dataclass
class Reference:
    """The unedited run of one batch; every tensor on the CPU, statistics in float32.

    batch: the B examples. emitted: greedy ids (B, T). steps: bool (B, T), steps up to and
    including the first end-of-sequence. probs: teacher-forced output probabilities
    (B, T, V) float32. sites: the edited site names. weights: site -> reference weights
    (B, H, T, n) float32, query row t = step t. eligible: bool (B, T, n), keys an
    intervention may move — eligible at every selected site and not a special token.
    first_example: index of the batch's first example in the audit data (seeds depend on
    it, not on batching). seed: the target's seed. encoded: the encoder state from
    ``target.encode`` when edited re-runs may reuse it, else None. head_index: the model's
    indices of the edited heads (the same at every edited site), or None for all heads;
    ``weights`` then holds only those heads, and the other heads run unedited. states: the
    unedited decoder state before every step (``target.decode_states``) when edited items
    run one cached decoder step, else None. budget: sets how many edited sequences one
    forward pass folds. empty_output: bool (B,), the greedy output ends at step 0 (None:
    no output is empty); negligible: bool (B, T), rows whose edited prompt views hold a
    negligible share of the row, or None; see :mod:`attnaudit.analysis.degenerate`.
    cache_note: why edited items re-run the prefix although the target offers a cached
    step (None: they do not, or it was not offered). greedy_seconds: what the greedy
    decoding of ``batch`` took (a validity audit of the same batch counts it as its first
    timed run instead of decoding again); forced_seconds: what its teacher-forced pass under
    capture took (the audit's plan prices the validity audit's passes by both).
    mixed_steps: edited items at
    different steps after the first share one cached call (``target.decode_steps``,
    checked against the teacher-forced pass: :func:`cached_states`; :meth:`call_group`).
    mechanisms: site -> the capture
    mechanism its calls came through (``sdpa``, ``softmax``, ``mha``, ``tap``...);
    value_sites: the edited sites whose values capture held, where a value edit applies.
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
    budget: ChunkBudget
    encoded: Any = None
    head_index: tuple[int, ...] | None = None
    states: Any = None
    empty_output: torch.Tensor | None = None
    cache_note: str | None = None
    mixed_steps: bool = False
    negligible: torch.Tensor | None = None
    mechanisms: dict[str, str] = field(default_factory=dict)
    value_sites: tuple[str, ...] = ()
    greedy_seconds: float | None = None
    forced_seconds: float | None = None

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

    @property
    def reasons(self) -> torch.Tensor:
        """Long (B, T): why each row is degenerate, an index into
        :data:`~attnaudit.analysis.degenerate.REASONS` (0: counted)."""
        empty = (torch.zeros(len(self.batch), dtype=torch.bool) if self.empty_output is None
                 else self.empty_output)
        return row_reasons(self.steps, self.eligible, empty, self.negligible)

    def rows(self) -> RowIndex:
        """Every (example, step) row within the step mask that is not degenerate."""
        example, step = (self.steps & (self.reasons == 0)).nonzero(as_tuple=True)
        return RowIndex(example, step)

    def call_group(self, step: torch.Tensor) -> torch.Tensor:
        """(M,) long: for items at ``step`` (M,), which of them may share one cached call
        (equal values): items at one step, or with :attr:`mixed_steps` those of step 0 and
        those of every later step."""
        return step.clamp(max=1) if self.mixed_steps else step

    def positions(self, step: int) -> int:
        """Decoder positions an edited item at ``step`` runs: 1 from a cached state, else
        the prefix 0..step."""
        return 1 if self.states is not None else step + 1


@dataclass(frozen=True)
class RowIndex:
    """N query rows by index, no weights: example (N,) long, local to the reference batch;
    step (N,) long."""

    example: torch.Tensor
    step: torch.Tensor

    def __len__(self) -> int:
        return int(self.example.shape[0])

    def select(self, index: torch.Tensor) -> RowIndex:
        return RowIndex(self.example[index], self.step[index])



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
              first_example: int = 0, incremental: bool = True,
              max_memory: int | str | None = None) -> Reference:
    """Greedy output, teacher-forced probabilities and reference weights for ``batch``.

    sites: the sites to edit (default every site of ``kind``); heads: edit only these
    heads at each of them (default all). incremental: let edited items run one cached
    decoder step when the target offers ``decode_states``/``decode_step`` (False: re-run
    the prefix, the reference path the cached one is tested against). max_memory: the
    budget of one chunk of edited sequences (bytes or "2GiB"; default
    :data:`~attnaudit.capturing.blocks.DEFAULT_MAX_MEMORY`).
    """
    encoded, in_encoder = None, set()
    with torch.no_grad():
        emitted, greedy_seconds = timed(lambda: target.greedy(batch))
        started = time.perf_counter()
        with capture(target.model, sites=target.sites, kinds=target.kinds) as cap:
            if target.encode is not None and target.decode is not None:
                encoded = target.encode(batch)
                in_encoder = set(cap.records)
                logits = target.decode(batch, encoded, emitted)
            else:
                logits = target.teacher_forced(batch, emitted)
        forced_seconds = time.perf_counter() - started
        names = select_sites(cap.records, sites, kind)
        if in_encoder.intersection(names):
            encoded = None  # an edit there changes the encoder output: re-encode every copy
        states, cache_note, mixed_steps = None, None, False
        if (incremental and encoded is not None and target.decode_states is not None
                and target.decode_step is not None):
            states, cache_note, mixed_steps = cached_states(target, batch, encoded, emitted,
                                                            logits)
    n_examples, n_steps = emitted.shape
    n_keys = batch.source_ids.shape[1]
    weights, shares = {}, []
    eligible = target.explain_keys(batch).cpu()[:, None, :].expand(-1, n_steps, -1)
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
        mask = None if mask is None else mask.expand(w.shape).cpu()
        if heads is not None:
            _check_heads(name, heads, int(w.shape[1]))
            w = w[:, list(heads)]
            mask = None if mask is None else mask[:, list(heads)]
        weights[name] = w.float().cpu()
        share = rec.share
        if share is not None:
            shares.append(share if heads is None else share[:, list(heads)])
        if mask is not None:
            eligible = eligible & mask.all(1)
    probs = torch.softmax(logits.float(), -1).cpu()
    mechanisms = {n: cap.records[n].site.mechanism for n in names}
    value_sites = tuple(n for n in names if n in cap.value_sites)
    del logits, cap
    budget = _budget(target, encoded, states, n_examples, n_keys,
                     vocab=int(probs.shape[-1]),
                     site_heads=sum(int(w.shape[1]) for w in weights.values()),
                     max_memory=max_memory)
    return Reference(batch=batch, emitted=emitted, steps=target.step_mask(emitted).cpu(),
                     probs=probs, sites=names, weights=weights,
                     eligible=eligible.contiguous(), first_example=first_example,
                     seed=target.seed, budget=budget, encoded=encoded,
                     head_index=None if heads is None else tuple(heads), states=states,
                     cache_note=cache_note, mixed_steps=mixed_steps,
                     mechanisms=mechanisms, value_sites=value_sites,
                     greedy_seconds=greedy_seconds, forced_seconds=forced_seconds,
                     empty_output=(emitted[:, 0] == target.eos_id).cpu() if n_steps
                     else torch.ones(n_examples, dtype=torch.bool),
                     negligible=negligible_rows(shares) if len(shares) == len(names) else None)


def cached_states(target: Seq2SeqTarget, batch: Batch, encoded: Any, emitted: torch.Tensor,
                  logits: torch.Tensor) -> tuple[Any, str | None, bool]:
    """The unedited decoder states (``target.decode_states``) when one cached step from
    them gives the teacher-forced output, else None and why: the target says its states or
    step cannot be taken (:data:`CACHE_REFUSALS`: a Hugging Face cache that cannot be cut
    back to an earlier position, a model that returns none), or their first and last steps'
    output distributions differ from the teacher-forced ``logits`` (B, T, V) by more than
    :func:`step_tolerance` in total variation. Edited items then re-run the prefix, which
    needs no cache. Any other error is a bug in the cached path and propagates: falling back
    would hide it behind a slower run.

    The third value: whether items at different steps after the first may share one call
    (``target.decode_steps``; step 0's input is the prompt's last position, which such a
    call cannot place among the prompt's keys): its one call on every example at step 1 and
    at the last step gave the teacher-forced output as above (then ``decode_step`` is
    checked at step 0 only). Below three steps nothing is shared."""
    n_steps = emitted.shape[1]
    decode_states, decode_step = target.decode_states, target.decode_step
    if n_steps == 0 or decode_states is None or decode_step is None:
        return None, None, False
    tolerance = step_tolerance(logits.dtype)
    try:
        states = decode_states(batch, encoded, emitted)
        every = torch.arange(len(emitted))
        mixed = False
        if target.decode_steps is not None and n_steps >= 3:
            rows = every.repeat(2)
            steps = torch.tensor([1, n_steps - 1]).repeat_interleave(len(emitted))
            stepped = target.decode_steps(batch.select(rows), select_state(encoded, rows),
                                          select_state(states, rows), emitted[rows], steps)
            mixed = float(logits_tvd(stepped, logits[rows, steps]).max()) <= tolerance
        for step in [0] if mixed else sorted({0, n_steps - 1}):
            stepped = decode_step(batch, encoded, select_state(states, every), emitted, step)
            gap = float(logits_tvd(stepped, logits[:, step]).max())
            if not gap <= tolerance:
                return None, (f"one cached step disagreed with the teacher-forced pass at step "
                              f"{step} (total variation {gap:.3g})"), False
    except CACHE_REFUSALS as exc:
        return None, f"one cached step could not be taken: {type(exc).__name__}: {exc}", False
    return states, None, mixed


def _budget(target: Seq2SeqTarget, encoded: Any, states: Any, n_examples: int, n_keys: int,
            *, vocab: int, site_heads: int, max_memory: int | str | None) -> ChunkBudget:
    """The chunk budget: each edited sequence copies its example's cached states, or, without
    them, re-runs the encoder over the source."""
    if encoded is not None:
        state_bytes = (tensor_bytes(encoded) + tensor_bytes(states)) // max(n_examples, 1)
    else:
        state_bytes = encoder_bytes(target.model, n_keys)
    return ChunkBudget.of(target.model, vocab=vocab, keys=n_keys, site_heads=site_heads,
                          state_bytes=state_bytes, max_memory=max_memory)


def _check_heads(site: str, heads: Sequence[int], n_heads: int) -> None:
    if not heads or len(set(heads)) != len(heads) or not all(0 <= h < n_heads for h in heads):
        raise InterventionError(f"heads {list(heads)} are not distinct head indices of site "
                                f"{site!r}, which has {n_heads} head(s)")
