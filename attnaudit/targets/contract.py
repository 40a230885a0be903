"""The target contract: a model, its data, and how to run it, in two families.

Every target implements :class:`AuditTarget`: besides the callables below it says its
:attr:`~AuditTarget.family` (:class:`~attnaudit.record.Family`) and the attention roles its
sites take, with their titles (:attr:`~AuditTarget.roles`, in the one vocabulary of
:class:`~attnaudit.record.Role`), so that the layers above read both from the target
rather than from site names:

- :class:`Seq2SeqTarget`, the encoder-decoder family: roles ``encoder_self``,
  ``decoder_self`` and ``cross``; any model can be wrapped in one, by hand;
- :class:`DecoderOnlyTarget`, the decoder-only family (prompt -> continuation, the prompt
  where a source stands): roles :attr:`~attnaudit.record.Role.PROMPT` (the continuation
  over the prompt) and :attr:`~attnaudit.record.Role.CONTINUATION` (over itself), shown
  as prompt views (:mod:`attnaudit.capturing.views`), and ``self`` for the raw
  self-attention of :meth:`DecoderOnlyTarget.raw_pass`. It keeps the contract below, so
  every protocol runs on it unchanged.

Both may have sites of any other attention, role ``captured``.

A :class:`Seq2SeqTarget` bundles the model with plain callables, so any model can be
audited without changing its code:

- ``batches()`` yields :class:`Batch` objects (source ids ``(B, n)``, source mask, texts,
  and whatever else the model needs in ``inputs``; ``inputs["offsets"]``, when given,
  is ``(B, n, 2)`` character offsets of the source tokens, which word-level tables use);
- ``greedy(batch)`` returns the emitted ids ``(B, T)`` (the decoder start token excluded,
  end-of-sequence included, anything after it is padding): the output the audit explains,
  a hand-written target's greedy decoding, or for a Hugging Face target the hypothesis its
  :class:`~attnaudit.targets.decoding.Decoding` returns (by default the model's own
  generation settings: beams included);
- ``teacher_forced(batch, emitted)`` returns logits ``(B, T, V)`` where position ``t``
  predicts ``emitted[:, t]`` from ``emitted[:, :t]`` and the source, i.e. the model's own
  greedy output fed back — the default seq2seq protocol of docs/metrics.md;
- ``source_embedding`` is the module whose first call in a forward pass embeds the source
  (attributions hook that call only, so an embedding shared with the decoder is safe);
- optionally ``encode(batch)`` and ``decode(batch, encoded, emitted)``, the two halves of
  ``teacher_forced``: interventions that edit only decoder-side attention then encode each
  example once and re-run only the decoder for its many edited copies;
- optionally, with those, ``decode_states(batch, encoded, emitted)`` and
  ``decode_step(batch, encoded, states, emitted, step)``: the decoder's state before every
  step from one unedited teacher-forced pass (a KV cache, a recurrent state), and one
  decoder step from it. An edited copy of step ``t`` then runs one step instead of the
  prefix ``0..t``. :func:`~attnaudit.targets.hf.loading.from_hf` provides both from the
  model's KV cache; with them, ``decode_steps(batch, encoded, states, emitted, steps)``
  runs each row at its own step in one call (a decoder-only model's key/value cache,
  the positions a row has not reached masked);
- optionally ``cached_decode(batch, emitted)``: logits ``(B, T', V)``, ``T' <= T``, of the
  same steps as the model's own cached decoding computes them (the source once, then one
  position per step from the model's cache, as its ``generate()`` runs; it may stop once
  every row has ended), which the validity audit compares with ``teacher_forced``
  (:mod:`attnaudit.analysis.cached_decoding`).

Cross-attention keys are source positions: key ``j`` of a cross-attention row is
``batch.source_ids[:, j]``. Build a target from parts, with
:func:`~attnaudit.targets.hf.loading.from_hf` for a Hugging Face model, or load one by name
with :func:`~attnaudit.targets.loading.load_target`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from torch import nn

from attnaudit.capturing.sites import SiteSelection
from attnaudit.errors import OptionError
from attnaudit.record import Family, Role
from attnaudit.targets.decoding import Decoding

OTHER_TITLE = "other attention"  # the title of role ``captured`` in every family


@dataclass
class Batch:
    """One batch of sources.

    source_ids: (B, n) long. source_mask: (B, n) bool, True on real (non-padding) tokens.
    texts: the B source strings. references: gold target strings when known.
    inputs: anything else the target's callables need; a tensor whose first axis is B
        follows the batch through :meth:`select` and :meth:`repeat`.
    """

    source_ids: torch.Tensor
    source_mask: torch.Tensor
    texts: list[str]
    references: list[str] | None = None
    inputs: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.source_ids.shape[0])

    def select(self, index: torch.Tensor | Sequence[int]) -> Batch:
        """The examples at ``index`` (a long tensor or list of positions), in that order."""
        index = torch.as_tensor(index, dtype=torch.long)
        picks = index.tolist()
        return Batch(
            self.source_ids[index],
            self.source_mask[index],
            [self.texts[i] for i in picks],
            None if self.references is None else [self.references[i] for i in picks],
            {k: _take(v, index, len(self)) for k, v in self.inputs.items()},
        )

    def to(self, device: torch.device) -> Batch:
        """The batch with every tensor on ``device``."""
        moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v
                 for k, v in self.inputs.items()}
        return Batch(self.source_ids.to(device), self.source_mask.to(device), self.texts,
                     self.references, moved)

    def repeat(self, times: int) -> Batch:
        """Each example ``times`` times in a row: (B, ...) -> (B * times, ...)."""
        return self.select(torch.arange(len(self)).repeat_interleave(times))


def _take(value: Any, index: torch.Tensor, size: int) -> Any:
    if isinstance(value, torch.Tensor) and value.ndim and value.shape[0] == size:
        return value[index.to(value.device)]
    if isinstance(value, list) and len(value) == size:
        return [value[i] for i in index.tolist()]
    return value


@dataclass
class Expectation:
    """Where attention is expected to go, e.g. the date task's source-year characters.

    keys(batch, emitted) -> bool (B, n) or (B, T, n): expected source keys.
    rows: query steps that count — the first ``rows`` steps, or None for every step.
    """

    name: str
    keys: Callable[[Batch, torch.Tensor], torch.Tensor]
    rows: int | None = None


@runtime_checkable
class AuditTarget(Protocol):
    """What every target family offers the layers above (module docstring): its family,
    the roles of its attention with their titles, and the data and the runs the protocols
    use (the attributes of :class:`Seq2SeqTarget`)."""

    family: ClassVar[Family]
    roles: ClassVar[Mapping[Role, str]]
    name: str
    model: nn.Module

    def iter_batches(self, limit: int | None = None) -> Iterator[Batch]: ...

    def step_mask(self, emitted: torch.Tensor) -> torch.Tensor: ...


@dataclass
class Seq2SeqTarget:
    """A model under audit and how to run it (see the module docstring for the contract):
    the encoder-decoder family, and the contract every family keeps.

    Attributes:
        name: short label used in reports.
        model: the unmodified model.
        batches: () -> iterable of :class:`Batch`, the audit data.
        greedy: batch -> emitted ids (B, T) long: the audited output (the name is the
            protocol's historical one; see ``decoding``).
        teacher_forced: (batch, emitted (B, T)) -> logits (B, T, V).
        source_embedding: module whose first call per forward embeds the source.
        target_embedding: optional, the module embedding the decoder's input tokens (its
            calls after the source's: one ``(B, T, d)``, or one ``(B, d)`` per step), for
            target-side attribution.
        first_prefix_input: the first decoder input that target-side attribution scores (1
            for a decoder-only target, whose input 0, the prompt's last token, is a prompt
            token scored on the source side).
        unk_id: optional, the unknown token's id (the ``"unk"`` attribution baseline).
        source_tokens: batch -> per example, a label per source position.
        target_tokens: emitted (B, T) -> per example, a label per step.
        eos_id: id ending the output; steps after the first one are padding.
        special_ids: source ids left out of explanation metrics (pad, BOS, EOS ...).
        sites: capture site selection (None: every site).
        kinds: capture kind overrides, e.g. ``{"attend": "cross"}``.
        expectations: expected-key sets to report region_mass / top_weight_hit for.
        seed: seed for every random draw in interventions.
        description: one paragraph for the report.
        encode: optional, batch -> encoder state: a tensor, or a tuple/list/dict of them,
            each with the batch on its first axis.
        decode: optional, (batch, encoder state, emitted (B, T)) -> logits (B, T, V), equal
            to ``teacher_forced(batch, emitted)`` when the state comes from ``encode(batch)``.
        decode_states: optional, (batch, encoder state, emitted (B, T)) -> the decoder state
            before every step 0..T-1, from one teacher-forced pass: a tensor, or a
            tuple/list/dict of them, each with the batch on its first axis.
        decode_step: optional, (batch, encoder state, decoder states, emitted (B, T),
            step t) -> logits (B, V) at step t, run from the state before t; equal to
            ``decode(batch, encoded, emitted)[:, t]``. Used only with ``decode_states``.
        decode_steps: optional, (batch, encoder state, decoder states, emitted (B, T),
            steps (B,) long) -> logits (B, V), row ``i`` at its own step ``steps[i]``, run
            from the state before it: ``decode_step``'s rows, every step in one call. The
            interventions then fold edited items of steps 1 onward into one call (step 0
            keeps its own), once one call at step 1 and at the last step gave the
            teacher-forced output.
        cached_decode: optional, (batch, emitted (B, T)) -> logits (B, T', V), T' <= T,
            of the steps as the model's own cached decoding computes them (one step at a
            time from its cache, fed the emitted tokens, until every row has ended); where
            a model's cached steps and its one teacher-forced pass differ, the audit says
            so.
        device: where the model runs; batches are moved there (None: as yielded).
        truncation: one sentence on how sources were truncated, for the report.
        decoding: the decoding settings ``greedy`` runs with, for the manifest and the
            report (None: the target's own greedy function).
        gold_alignments: optional, (batch, emitted (B, T)) -> per example, its gold word
            alignment as a Pharaoh line (``i-j`` sure, ``i-pj`` possible) in token units:
            eligible source token i (``explain_keys``, in order), output token j (the
            emitted tokens before the end of sequence); the audit then reports the
            alignment error rate of every measure (docs/alignments.md).
    """

    name: str
    model: nn.Module
    batches: Callable[[], Iterable[Batch]]
    greedy: Callable[[Batch], torch.Tensor]
    teacher_forced: Callable[[Batch, torch.Tensor], torch.Tensor]
    source_embedding: nn.Module | None
    source_tokens: Callable[[Batch], list[list[str]]]
    target_tokens: Callable[[torch.Tensor], list[list[str]]]
    eos_id: int
    special_ids: tuple[int, ...] = ()
    sites: SiteSelection = None
    kinds: Mapping[str, str] | None = None
    expectations: tuple[Expectation, ...] = ()
    seed: int = 0
    description: str = ""
    encode: Callable[[Batch], Any] | None = None
    decode: Callable[[Batch, Any, torch.Tensor], torch.Tensor] | None = None
    decode_states: Callable[[Batch, Any, torch.Tensor], Any] | None = None
    decode_step: Callable[[Batch, Any, Any, torch.Tensor, int], torch.Tensor] | None = None
    decode_steps: Callable[[Batch, Any, Any, torch.Tensor, torch.Tensor],
                           torch.Tensor] | None = None
    cached_decode: Callable[[Batch, torch.Tensor], torch.Tensor] | None = None
    device: torch.device | None = None
    truncation: str = ""
    target_embedding: nn.Module | None = None
    first_prefix_input: int = 0
    unk_id: int | None = None
    decoding: Decoding | None = None
    gold_alignments: Callable[[Batch, torch.Tensor], list[str]] | None = None

    family: ClassVar[Family] = Family.ENCODER_DECODER
    roles: ClassVar[Mapping[Role, str]] = MappingProxyType({
        Role.ENCODER_SELF: "encoder self-attention", Role.DECODER_SELF: "decoder self-attention",
        Role.CROSS: "cross-attention", Role.CAPTURED: OTHER_TITLE})

    def step_mask(self, emitted: torch.Tensor) -> torch.Tensor:
        """Bool (B, T): steps up to and including the first ``eos_id``."""
        is_eos = emitted == self.eos_id
        return (is_eos.long().cumsum(-1) - is_eos.long()) == 0

    def explain_keys(self, batch: Batch) -> torch.Tensor:
        """Bool (B, n): source keys counted by explanation metrics (real, not special)."""
        keep = batch.source_mask.clone()
        for special in self.special_ids:
            keep &= batch.source_ids != special
        return keep

    def iter_batches(self, limit: int | None = None) -> Iterator[Batch]:
        """The audit data, cut after ``limit`` examples (>= 0) when given."""
        if limit is not None and limit < 0:
            raise OptionError(f"limit must be >= 0 examples, got {limit}")
        seen = 0
        for batch in self.batches():
            if self.device is not None:
                batch = batch.to(self.device)
            if limit is not None and seen + len(batch) > limit:
                batch = batch.select(torch.arange(limit - seen))
            if len(batch):
                yield batch
            seen += len(batch)
            if limit is not None and seen >= limit:
                return

    def with_options(self, **changes: Any) -> Seq2SeqTarget:
        """A copy with some attributes changed."""
        return replace(self, **changes)


@dataclass
class DecoderOnlyTarget(Seq2SeqTarget):
    """A decoder-only model continuing prompts: the decoder-only family (module docstring).

    The contract's source is the prompt (``source_ids`` (B, P), left-padded), its output the
    continuation; the callables run the model under prompt views
    (:mod:`attnaudit.capturing.views`), whose records carry the roles :attr:`roles` names.
    :func:`~attnaudit.targets.hf.loading.from_hf` builds one for a causal LM.

    Attributes (besides :class:`Seq2SeqTarget`'s):
        sequence: (batch, emitted (B, T)) -> the keyword inputs of the model's one pass over
            prompt + ``emitted[:, :-1]`` (ids, attention mask, and position ids where the
            model takes them), as its own ``generate()`` builds them, the model's own input
            rules included; their ``input_ids`` / ``attention_mask`` (B, P + T - 1) are the
            keys of the raw self-attention and its real positions.
        raw_pass: (batch, emitted (B, T)) -> the model's output of that pass run *without*
            prompt views (the raw self-attention, role ``self``, over every earlier
            position), computing the last position's logits only where the model can: what
            contribution measures trace (:mod:`attnaudit.contributions.trace`).
        first_prefix_input: 1: input 0 of the steps, the prompt's last token, is a prompt
            token, scored on the source side.
        teacher_forced_from: optional, (batch, decoder states, emitted (B, T), start) ->
            logits (B, T, V) equal to ``teacher_forced(batch, emitted)`` for a batch whose
            prompt ids differ from those the states (``decode_states`` of the unedited
            batch, its rows selected) were taken on only at positions ``start`` on: the
            positions before come from the states' cache, the rest run (edited prompts:
            leave-one-out, faithfulness).
    """

    sequence: Callable[[Batch, torch.Tensor], dict[str, torch.Tensor]] | None = None
    raw_pass: Callable[[Batch, torch.Tensor], Any] | None = None
    teacher_forced_from: Callable[[Batch, Any, torch.Tensor, int], torch.Tensor] | None = None
    first_prefix_input: int = 1

    family: ClassVar[Family] = Family.DECODER_ONLY
    roles: ClassVar[Mapping[Role, str]] = MappingProxyType({
        Role.PROMPT: "continuation over the prompt",
        Role.CONTINUATION: "continuation over itself",
        Role.SELF: "self-attention", Role.CAPTURED: OTHER_TITLE})


FAMILIES: Mapping[Family, type[Seq2SeqTarget]] = MappingProxyType({
    target.family: target for target in (Seq2SeqTarget, DecoderOnlyTarget)})


def role_titles(family: Family | str | None) -> Mapping[Role, str]:
    """Each role's title in ``family`` (:attr:`AuditTarget.roles`); for None (a bare
    capture, no target) every role's plain title."""
    if family is None:
        return MappingProxyType({**Seq2SeqTarget.roles, Role.SELF: "self-attention"})
    return FAMILIES[Family(family)].roles


def role_title(family: Family | str | None, role: str) -> str:
    """The title of ``role`` (a :class:`~attnaudit.record.Role` or its string) in
    ``family`` (:func:`role_titles`); the role itself where the family names no title."""
    return next((title for known, title in role_titles(family).items() if known == role), role)


def select_state(state: Any, index: torch.Tensor) -> Any:
    """An encoder state (tensor, or tuple/list/dict of tensors with the batch first) at
    ``index`` along the batch axis; anything else passes through unchanged."""
    if isinstance(state, torch.Tensor):
        return state[index.to(state.device)]
    if isinstance(state, tuple | list):
        return type(state)(select_state(part, index) for part in state)
    if isinstance(state, dict):  # also a Hugging Face ModelOutput, kept as its own type
        parts = {key: select_state(part, index) for key, part in state.items()}
        return parts if type(state) is dict else type(state)(**parts)
    return state
