"""Decoder-only (causal) language models as audit targets: prompt -> continuation.

:class:`CausalLM` runs a Hugging Face causal LM (GPT-2, Llama ...) and its tokenizer as
the callables of a :class:`~attnaudit.targets.contract.DecoderOnlyTarget`, the decoder-only
family of the contract the protocols use; :func:`~attnaudit.targets.hf.loading.from_hf`
builds that target for a checkpoint whose config is not an encoder-decoder. The mapping:

- the *source* is the prompt, left-padded as Hugging Face batches it: ``source_ids`` (B, P),
  ``source_mask`` True on real tokens; prompts longer than the limit keep their last tokens;
- the *output* is the continuation the target's decoding returns (greedy, or the best beam
  of the model's generation settings: :mod:`attnaudit.targets.decoding`), ending at the
  first end-of-sequence token; ``teacher_forced`` runs prompt + continuation once, and
  the row at position ``P-1 + t`` gives the logits of continuation token ``t``;
- the model's self-attention is presented to capture as two views per layer
  (:mod:`attnaudit.capturing.views`): ``:cross``, role ``PROMPT``, the continuation rows
  over the prompt keys (renormalised over the prompt), and ``:self``, role
  ``CONTINUATION``, the same rows over the prompt's last token and the generated prefix
  (renormalised over those, causal); :meth:`CausalLM.raw_pass` runs the same pass without
  views (role ``self``), for contribution measures;
- ``source_embedding`` is the model's input embedding, called on the prompt first in every
  teacher-forced pass, so attribution and leave-one-out see the prompt positions;
  ``target_embedding`` is the same module, whose second call embeds the steps' inputs (the
  prompt's last token, then the emitted prefix), so target-side attribution scores the
  generated prefix. A model that must see the token ids themselves (:attr:`CausalLM.reads_ids`)
  runs on ids instead, and its target declares neither embedding: gradient attribution
  then says it cannot run (the target declares no source embedding), while capture,
  interventions and leave-one-out (which edits ids) run as on any other model.

Eligible prompt keys come from the attention mask (left padding is out) and the special
tokens; causality holds by construction (every prompt key precedes every continuation row).
An edited step runs one position from a copy of the model's own cache after the unedited
pass, cut back through the cache's API (``decode_states`` / ``decode_step``,
:mod:`attnaudit.targets.hf.cache`); where that cannot be done the intervention runner
re-runs the prefix. ``cached_decode`` gives the logits the model's own ``generate()``
computes along the continuation, for the validity audit's comparison with the one
teacher-forced pass (:func:`~attnaudit.targets.decoding.forced_logits`,
:mod:`attnaudit.analysis.cached_decoding`). The prompt ids stand in for an encoder state.

Every pass's inputs come from one place, :meth:`CausalLM.sequence`: position ids as the
model's ``generate()`` gives them, and the model's own input rules: a model that builds its
own input from the ids (CPM-Ant: learned positions before the sequence, padding read from
the ids, a one pass that attends both ways) is run as its ``generate()`` runs it
(:mod:`attnaudit.targets.hf.own_input`); whether its forward can compute the last positions'
logits only (``logits_to_keep``) is read once, in :attr:`CausalLM.keeps_logits`.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch

from attnaudit.capturing.views import prompt_views
from attnaudit.errors import TargetError
from attnaudit.targets.contract import Batch, DecoderOnlyTarget
from attnaudit.targets.data import AuditData
from attnaudit.targets.decoding import Decoding
from attnaudit.targets.hf.cache import cache_argument, cache_before, cache_state
from attnaudit.targets.hf.own_input import OwnInput, own_input, refuse_padding_ids
from attnaudit.targets.hf.tokenizer import source_limit, special_token_ids
from attnaudit.targets.kept_decoding import KeptDecoding
from attnaudit.targets.placement import input_device


def is_causal_lm(config: Any) -> bool:
    """True for a Hugging Face config of a decoder-only model (not an encoder-decoder)."""
    return config is not None and not getattr(config, "is_encoder_decoder", False)


def left_padded(rows: list[list[Any]], fill: Any, limit: int | None) -> torch.Tensor:
    """Per-token lists (ids, or offset pairs) -> a (B, P, ...) tensor, left-padded with
    ``fill``; a list longer than ``limit`` keeps its last ``limit`` items."""
    kept = [row[-limit:] if limit is not None else row for row in rows]
    width = max(len(row) for row in kept)
    out = torch.tensor(fill).expand(len(kept), width, *torch.tensor(fill).shape).clone()
    for at, row in enumerate(kept):
        if row:
            out[at, width - len(row):] = torch.tensor(row, dtype=out.dtype)
    return out


def _positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids (B, L) counting real tokens only (padding at 0), as generate() sets them
    for a model that does not set its own."""
    return (mask.cumsum(-1) - 1).clamp_min(0)


def _prompt(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch's prompt ids (B, P) and mask (B, P) bool: the contract's source."""
    return batch.source_ids, batch.source_mask


@dataclass
class CausalLM:
    """How a causal LM runs prompt -> continuation: what the target's callables call.

    eos_id: ends a continuation (None: neither tokenizer nor config names one). pad_id:
    pads prompts on the left (the id the model reads as padding where it takes padding from
    the ids, :mod:`~attnaudit.targets.hf.own_input`; else the tokenizer's or config's pad,
    else ``eos_id``). decoding:
    how continuations are decoded. limit: prompt tokens kept (the last ones), or None.
    """

    model: Any  # a transformers PreTrainedModel: generate(), get_input_embeddings(), config
    tokenizer: Any
    decoding: Decoding
    limit: int | None = None
    _kept: KeptDecoding = field(default_factory=KeptDecoding, init=False, repr=False)

    @property
    def eos_id(self) -> int | None:
        eos = self.tokenizer.eos_token_id
        eos = getattr(self.model.config, "eos_token_id", None) if eos is None else eos
        if isinstance(eos, list | tuple):
            return eos[0] if eos else None
        return eos

    @property
    def end_id(self) -> int:
        """:attr:`eos_id`, which a causal target cannot be built without."""
        if self.eos_id is None:
            raise TargetError(f"{type(self.model).__name__}: a causal LM target needs an "
                              "end-of-sequence id (tokenizer.eos_token_id or "
                              "config.eos_token_id)")
        return self.eos_id

    @cached_property
    def own(self) -> OwnInput:
        """What the model builds from its ids itself (learned positions, padding)."""
        return own_input(self.model)

    @property
    def pad_id(self) -> int | None:
        if self.own.pad_id is not None:
            return self.own.pad_id
        config_pad = getattr(self.model.config, "pad_token_id", None)
        return next((i for i in (self.tokenizer.pad_token_id, config_pad) if i is not None),
                    self.eos_id)

    @property
    def special_ids(self) -> tuple[int, ...]:
        return special_token_ids(self.tokenizer, self.pad_id, self.eos_id)

    def prompts(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """Left-padded ids (B, P), mask (B, P) bool, and inputs: the tokens' character
        offsets (B, P, 2) when the tokenizer is a fast one."""
        fast = bool(getattr(self.tokenizer, "is_fast", False))
        # verbose=False: over-long prompts are cut to their last tokens below, with a warning
        enc = self.tokenizer(texts, return_offsets_mapping=fast, verbose=False)
        ids = left_padded(enc["input_ids"], self.pad_id, self.limit)
        mask = left_padded([[True] * len(row) for row in enc["input_ids"]], False, self.limit)
        refuse_padding_ids(ids, mask, self.own.pad_id, self.model)
        offsets = {"offsets": left_padded(enc["offset_mapping"], (0, 0), self.limit)}
        return ids, mask, offsets if fast else {}

    @cached_property
    def keeps_logits(self) -> bool:
        """The model's forward can compute the logits of its last positions only."""
        return "logits_to_keep" in inspect.signature(self.model.forward).parameters

    def _logits_of(self, positions: int) -> dict[str, int]:
        """The keyword that makes the model compute the logits of its last ``positions``
        positions only (the output projection of a 50,000-token vocabulary costs more than
        the rest of a small model), when its forward takes one."""
        return {"logits_to_keep": positions} if self.keeps_logits else {}

    def continuations(self, texts: Sequence[str]) -> torch.Tensor:
        """Continuation texts as ids (B, T'), tokenized alone without special tokens (a
        text continues the prompt as written: give its leading space where the tokenizer
        marks one), right-padded with the end-of-sequence id."""
        rows = self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]
        width = max([1, *(len(row) for row in rows)])
        out = torch.full((len(rows), width), self.end_id, dtype=torch.long)
        for at, row in enumerate(rows):
            out[at, : len(row)] = torch.tensor(row, dtype=torch.long)
        return out

    def greedy(self, batch: Batch) -> torch.Tensor:
        """The continuation (B, T) of the batch's prompts that :attr:`decoding` returns
        (greedy, or the best beam); under prompt views, so that a capture of the decoding
        (an edit held while decoding) sees the ``:cross`` and ``:self`` sites the protocols
        edit."""
        ids, mask = _prompt(batch)
        with prompt_views(ids.shape[1], lead=self.own.lead):
            out = self._kept.generate(self.decoding, self.model, ids.shape[1], input_ids=ids,
                                      attention_mask=mask.long(), pad_token_id=self.pad_id,
                                      eos_token_id=self.eos_id)
        return out[:, ids.shape[1]:]

    @cached_property
    def reads_ids(self) -> bool:
        """True for a model that must be given the token ids, not their embeddings: its
        forward takes no ``inputs_embeds`` (CPM-Ant), or it reads the ids again beyond the
        embedding: experts routed by a fixed token -> expert table (``"hash_moe"`` in
        ``config.mlp_layer_types``: DeepSeek-V4). Such a model runs on ids, and its target
        declares no source or target embedding."""
        params = inspect.signature(self.model.forward).parameters
        layer_types = getattr(self.model.config, "mlp_layer_types", None) or ()
        return "inputs_embeds" not in params or "hash_moe" in layer_types

    def _finished(self, emitted: torch.Tensor) -> torch.Tensor:
        """``emitted`` (B, T) as the model is given it (:meth:`OwnInput.finished`)."""
        return self.own.finished(emitted, self.end_id)

    def _inputs(self, ids: torch.Tensor, prefix: torch.Tensor) -> dict[str, torch.Tensor]:
        """The forward's input for prompt ``ids`` (B, P) + ``prefix`` (B, T-1): ids for a
        model that :attr:`reads_ids`, else embeddings from two calls of the input
        embedding: the prompt (B, P) first (the source embedding's call), then the steps'
        inputs (B, T) as a seq2seq decoder's (the prompt's last token, then ``prefix``),
        whose first position is not used again (the prompt's call holds it), so
        target-side attribution gives it no score."""
        if self.reads_ids:
            return {"input_ids": torch.cat([ids, prefix], dim=1)}
        embed = self.model.get_input_embeddings()
        embedded_prompt = embed(ids)
        inputs = embed(torch.cat([ids[:, -1:], prefix], dim=1))
        return {"inputs_embeds": torch.cat([embedded_prompt, inputs[:, 1:]], dim=1)}

    def sequence(self, batch: Batch, emitted: torch.Tensor) -> dict[str, torch.Tensor]:
        """The model's input for one pass over prompt + ``emitted[:, :-1]``: ``input_ids``
        and ``attention_mask`` (B, P + T - 1), the continuation as the model is given it
        (:meth:`OwnInput.finished`), and ``position_ids`` as its generate() sets them
        (:meth:`_position_ids`). The one place every pass (teacher-forced, cached, raw)
        takes its inputs from."""
        ids, mask = _prompt(batch)
        prefix = self._finished(emitted)[:, :-1]
        sequence = torch.cat([ids, prefix], dim=1)
        full_mask = torch.cat([mask.long(), torch.ones_like(prefix)], dim=1)
        return {"input_ids": sequence, "attention_mask": full_mask,
                **self._position_ids(sequence, full_mask)}

    def _forward(self, batch: Batch, emitted: torch.Tensor, *, embedded: bool,
                 **options: Any) -> Any:
        """The model run once on :meth:`sequence` (embedded by :meth:`_inputs` when
        ``embedded``), with the prompt as the context its generate() gives it
        (:meth:`OwnInput.context`)."""
        inputs = self.sequence(batch, emitted)
        if embedded:
            ids = inputs.pop("input_ids")
            inputs.update(self._inputs(batch.source_ids, ids[:, batch.source_ids.shape[1]:]))
        with self.own.context(self.model, batch.source_ids.shape[1]):
            return self.model(**inputs, **options)

    def teacher_forced(self, batch: Batch, emitted: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, V): prompt + emitted[:, :-1] in one pass (:meth:`_inputs`), under
        prompt views."""
        with prompt_views(batch.source_ids.shape[1], lead=self.own.lead):
            out = self._forward(batch, emitted, embedded=True, use_cache=False,
                                **self._logits_of(emitted.shape[1]))
        return out.logits[:, -emitted.shape[1]:]

    def teacher_forced_from(self, batch: Batch, states: dict[str, Any], emitted: torch.Tensor,
                            start: int) -> torch.Tensor:
        """Logits (B, T, V) of :meth:`teacher_forced` for ``batch``, whose prompt differs
        from the one ``states`` (:meth:`decode_states` of the unedited batch, the rows
        selected) were taken on only at positions ``start`` on: positions ``< start`` come
        from a copy of the states' cache, the rest of prompt + ``emitted[:, :-1]`` runs."""
        inputs = self.sequence(batch, emitted)
        ids = inputs.pop("input_ids")
        prompt = batch.source_ids.shape[1]
        run = {k: v[:, start:] for k, v in self._inputs(batch.source_ids, ids[:, prompt:]).items()}
        if "position_ids" in inputs:
            inputs["position_ids"] = inputs["position_ids"][..., start:]
        cache = cache_before(states, self.own.lead + start)
        with prompt_views(prompt, positions=ids.shape[1], lead=self.own.lead), \
                self.own.context(self.model, prompt):
            out = self.model(**run, **inputs, use_cache=True,
                             **{cache_argument(self.model): cache},
                             **self._logits_of(emitted.shape[1]))
        return out.logits[:, -emitted.shape[1]:]

    def raw_pass(self, batch: Batch, emitted: torch.Tensor) -> Any:
        """The model's output of the teacher-forced pass on :meth:`sequence`'s ids, *without*
        prompt views (the raw self-attention over every earlier position); the last
        position's logits only where the model can (only its hidden states are read)."""
        return self._forward(batch, emitted, embedded=False, use_cache=False,
                             **self._logits_of(1))

    def encode(self, batch: Batch) -> torch.Tensor:
        """Nothing to encode: the prompt ids (B, P) stand in for an encoder state, so that an
        edited step runs one position from the unedited pass's key/value cache."""
        return batch.source_ids

    def decode(self, batch: Batch, encoded: Any, emitted: torch.Tensor) -> torch.Tensor:
        """:meth:`teacher_forced` (the prompt is in ``batch``)."""
        return self.teacher_forced(batch, emitted)

    def decode_states(self, batch: Batch, encoded: Any, emitted: torch.Tensor
                      ) -> dict[str, Any]:
        """The model's own cache after one teacher-forced pass over prompt +
        ``emitted[:, :-1]`` (P + T - 1 positions; position ``P-1 + t`` is the input of step
        ``t``; and the model's own leading positions, :attr:`OwnInput.lead`), as
        :func:`~attnaudit.targets.hf.cache.cache_state` keeps it; a TargetError when the
        model returns no cache that can be cut back."""
        out = self._forward(batch, emitted, embedded=True, use_cache=True,
                            **self._logits_of(1))
        cache = getattr(out, "cache", None)
        cache = getattr(out, "past_key_values", None) if cache is None else cache
        positions = self.own.lead + batch.source_ids.shape[1] + emitted.shape[1] - 1
        return cache_state(cache, len(batch), positions, batch.source_ids.device)

    def decode_step(self, batch: Batch, encoded: Any, states: dict[str, Any],
                    emitted: torch.Tensor, step: int) -> torch.Tensor:
        """Logits (B, V) of continuation step ``step``, one position run from a copy of the
        cached ones before it (``states``, the rows selected), under prompt views; a model
        that wants them is given the whole sequence's ids (:class:`OwnInput`)."""
        inputs = self.sequence(batch, emitted[:, :step + 1])  # prompt + emitted[:, :step]
        sequence = inputs.pop("input_ids")
        token = sequence if self.own.whole_ids_per_step else sequence[:, -1:]
        prompt = batch.source_ids.shape[1]
        before = prompt - 1 + step  # cached positions of the sequence
        cache = cache_before(states, self.own.lead + before)
        if "position_ids" in inputs:
            inputs["position_ids"] = inputs["position_ids"][..., -1:]
        with prompt_views(prompt, positions=before + 1, lead=self.own.lead):
            out = self.model(input_ids=token, use_cache=True, **inputs,
                             **{cache_argument(self.model): cache})
        return out.logits[:, -1]

    @cached_property
    def steps_in_one_call(self) -> bool:
        """Whether :meth:`decode_steps` can run rows at different steps in one call: the
        model reads padding from the attention mask and takes position ids, adds no
        positions of its own and is given one new position per cached step."""
        params = inspect.signature(self.model.forward).parameters
        own = self.own
        return (own.pad_id is None and own.lead == 0 and not own.whole_ids_per_step
                and self._takes_positions and "attention_mask" in params)

    def decode_steps(self, batch: Batch, encoded: Any, states: dict[str, Any],
                     emitted: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
        """Logits (B, V): row ``i`` of :meth:`decode_step` at its own step ``steps[i]``, all
        in one call. The cache is cut back to the latest step's positions; a row at an
        earlier step masks the cached positions it has not reached (its new position is
        the call's last, at its own position id), so it attends to what its own
        :meth:`decode_step` would."""
        last = int(steps.max())
        inputs = self.sequence(batch, emitted[:, :last + 1])  # prompt + emitted[:, :last]
        rows = torch.arange(len(batch), device=inputs["input_ids"].device)
        at = batch.source_ids.shape[1] - 1 + steps.to(rows.device)  # each row's new position
        before = int(inputs["input_ids"].shape[1]) - 1  # cached positions of the call
        reached = torch.arange(before, device=rows.device)[None, :] < at[:, None]
        mask = torch.cat([inputs["attention_mask"][:, :before] * reached,
                          torch.ones_like(at)[:, None]], dim=1)
        positions = inputs["position_ids"][..., rows, at].unsqueeze(-1)
        cache = cache_before(states, before)
        with prompt_views(batch.source_ids.shape[1], positions=before + 1):
            out = self.model(input_ids=inputs["input_ids"][rows, at][:, None], use_cache=True,
                             attention_mask=mask, position_ids=positions,
                             **{cache_argument(self.model): cache})
        return out.logits[:, -1]

    def cached_decode(self, batch: Batch, emitted: torch.Tensor) -> torch.Tensor:
        """Logits (B, T', V) of the continuation ``emitted`` (B, T) as the model's own
        ``generate()`` computes them (:func:`~attnaudit.targets.decoding.forced_logits`;
        those :meth:`greedy` kept when it has just decoded them,
        :mod:`~attnaudit.targets.kept_decoding`)."""
        ids, mask = _prompt(batch)
        return self._kept.forced(self.model, emitted, input_ids=ids, attention_mask=mask.long(),
                                 pad_token_id=self.pad_id, eos_token_id=self.eos_id)

    @cached_property
    def _takes_positions(self) -> bool:
        return "position_ids" in inspect.signature(self.model.forward).parameters

    def _position_ids(self, ids: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """``position_ids`` (B, L) for the sequence ``ids`` (B, L) under ``mask``, as the
        model's generate() sets them (its own ``_prepare_position_ids_for_generation``
        where it has one); nothing for a model whose forward takes none (it counts
        positions itself, as in its generate())."""
        if not self._takes_positions:
            return {}
        own = getattr(self.model, "_prepare_position_ids_for_generation", None)
        if own is None:
            return {"position_ids": _positions(mask)}
        return {"position_ids": own(ids, {"attention_mask": mask})}

    def tokens(self, ids: torch.Tensor) -> list[list[str]]:
        return [self.tokenizer.convert_ids_to_tokens(row.tolist()) for row in ids]

    def prompt_tokens(self, batch: Batch) -> list[list[str]]:
        return self.tokens(batch.source_ids)

    def description(self, origin: str) -> str:
        return (f"{type(self.model).__name__} (decoder-only) from "
                f"{origin or 'a loaded model'}: continuations of the prompts by "
                f"{self.decoding.search}{self.decoding.limit_text}; cross-attention is the "
                "continuation's attention over the prompt, renormalised over the prompt")

    def target(self, data: AuditData, *, batch_size: int, max_source_tokens: int | None,
               label: str, origin: str, name: str | None) -> DecoderOnlyTarget:
        """The target auditing prompt -> continuation on ``data``: prompts cut to the
        smaller of ``max_source_tokens`` and the position limit less the continuation,
        keeping their end; batches on the model's device."""
        if self.eos_id is None:
            raise TargetError(f"{label}: a causal LM target needs an end-of-sequence id "
                              "(tokenizer.eos_token_id or config.eos_token_id)")
        self.limit, truncation = source_limit(self.tokenizer, self.model.config, data.sources,
                                              max_source_tokens,
                                              reserved=self.decoding.max_new_tokens or 0)
        if self.limit is not None:
            truncation += " (a cut prompt keeps its last tokens)"
        where = input_device(self.model)
        embedding = None if self.reads_ids else self.model.get_input_embeddings()
        return DecoderOnlyTarget(
            name=name or label, model=self.model,
            batches=lambda: data.batches(batch_size, where, self.prompts, self.continuations),
            greedy=self.greedy, teacher_forced=self.teacher_forced,
            encode=self.encode, decode=self.decode, decode_states=self.decode_states,
            decode_step=self.decode_step,
            decode_steps=self.decode_steps if self.steps_in_one_call else None,
            cached_decode=self.cached_decode, sequence=self.sequence, raw_pass=self.raw_pass,
            teacher_forced_from=None if self.own.whole_ids_per_step else self.teacher_forced_from,
            source_embedding=embedding, source_tokens=self.prompt_tokens,
            target_tokens=self.tokens, eos_id=self.eos_id, special_ids=self.special_ids,
            description=self.description(origin), device=where,
            truncation=truncation, target_embedding=embedding,
            unk_id=self.tokenizer.unk_token_id, decoding=self.decoding)
