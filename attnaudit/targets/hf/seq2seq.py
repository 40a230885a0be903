"""Hugging Face encoder-decoder models (BART, Marian, T5, FSMT ...) as audit targets:
source -> the output the model's decoding returns (:mod:`attnaudit.targets.decoding`).

:class:`Seq2SeqLM` runs the model and its tokenizer as the callables of a
:class:`~attnaudit.targets.contract.Seq2SeqTarget`;
:func:`~attnaudit.targets.hf.loading.from_hf` builds that target for a checkpoint whose
config is an encoder-decoder. Sources are right-padded as the tokenizer pads them and cut to
their first ``limit`` tokens; a fast tokenizer adds the tokens' character offsets
(``inputs["offsets"]``, (B, n, 2)) for word-level tables. ``encode`` returns the encoder's
own output object and ``decode`` runs the decoder on it; ``decode_states`` is the key/value
cache of one teacher-forced pass and ``decode_step`` runs one cached decoder step from it,
so that an edited copy of step ``t`` runs one step instead of the prefix ``0..t``;
``cached_decode`` decodes the output again one step at a time, as ``generate()`` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from attnaudit.errors import TargetError
from attnaudit.targets.contract import Batch, Seq2SeqTarget
from attnaudit.targets.data import AuditData
from attnaudit.targets.decoding import Decoding
from attnaudit.targets.hf.cache import cache_argument, cache_before, cache_state
from attnaudit.targets.hf.tokenizer import source_limit, special_token_ids
from attnaudit.targets.kept_decoding import KeptDecoding
from attnaudit.targets.placement import input_device

# decode_states' value: the model's own cache with the rows it holds (hf.cache.cache_state)
KVStates = dict[str, Any]


@dataclass
class Seq2SeqLM:
    """How an encoder-decoder runs source -> output: what the target's callables call.

    start_id, pad_id, eos_id: the decoder's start token, the padding and the end of the
    output (the tokenizer's pad and eos, else the config's); None when neither names one.
    decoding: how outputs are decoded (beams, limits ...). limit: source tokens kept (the
    first ones), or None.
    """

    model: Any  # a transformers PreTrainedModel: get_encoder(), generate(), config
    tokenizer: Any
    decoding: Decoding
    limit: int | None = None
    _cache_arg: str = field(init=False, repr=False)
    _kept: KeptDecoding = field(default_factory=KeptDecoding, init=False, repr=False)

    def __post_init__(self) -> None:
        # the forward's signature is read once, not on every decoder step
        self._cache_arg = cache_argument(self.model)

    @property
    def start_id(self) -> int | None:
        return self.model.config.decoder_start_token_id

    @property
    def pad_id(self) -> int | None:
        pad = self.tokenizer.pad_token_id
        return getattr(self.model.config, "pad_token_id", None) if pad is None else pad

    @property
    def eos_id(self) -> int | None:
        eos = self.tokenizer.eos_token_id
        return getattr(self.model.config, "eos_token_id", None) if eos is None else eos

    @property
    def special_ids(self) -> tuple[int, ...]:
        return special_token_ids(self.tokenizer, self.pad_id, self.eos_id)

    def sources(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """Right-padded ids (B, n), mask (B, n) bool, and inputs: the tokens' character
        offsets (B, n, 2) when the tokenizer is a fast one."""
        fast = bool(getattr(self.tokenizer, "is_fast", False))
        enc = self.tokenizer(texts, padding=True, truncation=self.limit is not None,
                             max_length=self.limit, return_tensors="pt",
                             return_offsets_mapping=fast)
        inputs: dict[str, Any] = {"offsets": enc["offset_mapping"]} if fast else {}
        return enc["input_ids"], enc["attention_mask"].bool(), inputs

    def outputs(self, texts: Sequence[str]) -> torch.Tensor:
        """Output texts tokenized as targets: ids (B, T'), right-padded with ``eos_id``."""
        foil = self.tokenizer(text_target=list(texts), padding=True, return_tensors="pt")
        return foil["input_ids"].masked_fill(foil["attention_mask"] == 0, self.eos_id)

    def greedy(self, batch: Batch) -> torch.Tensor:
        """The output (B, T) of :attr:`decoding` (greedy, or the best beam), the decoder
        start token left out."""
        out = self._kept.generate(
            self.decoding, self.model, 1, input_ids=batch.source_ids,
            attention_mask=batch.source_mask.long(), decoder_start_token_id=self.start_id,
            pad_token_id=self.pad_id, eos_token_id=self.eos_id)
        return out[:, 1:]

    def encode(self, batch: Batch) -> Any:
        """The encoder's own output object (some models read more than its hidden states)."""
        return self.model.get_encoder()(input_ids=batch.source_ids,
                                        attention_mask=batch.source_mask.long())

    def _decoder_inputs(self, emitted: torch.Tensor) -> torch.Tensor:
        """(B, T): the start token, then ``emitted[:, :-1]``."""
        if self.start_id is None:
            raise TargetError(f"{type(self.model).__name__}: its config names no "
                              "decoder_start_token_id, so teacher forcing has no first input")
        return torch.cat([torch.full_like(emitted[:, :1], self.start_id), emitted[:, :-1]],
                         dim=1)

    def _run_decoder(self, batch: Batch, encoded: Any, decoder_ids: torch.Tensor,
                     **cache: Any) -> Any:
        # source ids too: some models (FSMT) build the decoder's causal mask only from them
        return self.model(input_ids=batch.source_ids, encoder_outputs=encoded,
                          attention_mask=batch.source_mask.long(),
                          decoder_input_ids=decoder_ids, **cache)

    def decode(self, batch: Batch, encoded: Any, emitted: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, V) of the decoder fed ``emitted`` from ``encoded``."""
        return self._run_decoder(batch, encoded, self._decoder_inputs(emitted),
                                 use_cache=False).logits

    def decode_states(self, batch: Batch, encoded: Any, emitted: torch.Tensor) -> KVStates:
        """The model's own cache after one teacher-forced pass (an ``EncoderDecoderCache``:
        decoder self-attention over T positions, position t = step t, and the cross-attention
        keys and values), as :func:`~attnaudit.targets.hf.cache.cache_state` keeps it."""
        out = self._run_decoder(batch, encoded, self._decoder_inputs(emitted), use_cache=True)
        return cache_state(getattr(out, self._cache_arg, None), len(emitted), emitted.shape[1],
                           emitted.device)

    def decode_step(self, batch: Batch, encoded: Any, states: KVStates,
                    emitted: torch.Tensor, step: int) -> torch.Tensor:
        """Logits (B, V) of step ``step``, one decoder position run from a copy of the cache
        cut back to the steps before it (the selected rows)."""
        previous = self._decoder_inputs(emitted)[:, step : step + 1]
        return self._run_decoder(batch, encoded, previous, use_cache=True,
                                 **{self._cache_arg: cache_before(states, step)}).logits[:, -1]

    def cached_decode(self, batch: Batch, emitted: torch.Tensor) -> torch.Tensor:
        """Logits (B, T', V) of ``emitted`` (B, T) as the model's own ``generate()`` computes
        them (:func:`~attnaudit.targets.decoding.forced_logits`; those :meth:`greedy` kept
        when it has just decoded them, :mod:`~attnaudit.targets.kept_decoding`)."""
        return self._kept.forced(self.model, emitted, input_ids=batch.source_ids,
                                 attention_mask=batch.source_mask.long(),
                                 decoder_start_token_id=self.start_id, pad_token_id=self.pad_id,
                                 eos_token_id=self.eos_id)

    def teacher_forced(self, batch: Batch, emitted: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, V): the source encoded, then the decoder fed ``emitted``."""
        return self.decode(batch, self.encode(batch), emitted)

    def tokens(self, ids: torch.Tensor) -> list[list[str]]:
        return [self.tokenizer.convert_ids_to_tokens(row.tolist()) for row in ids]

    def source_tokens(self, batch: Batch) -> list[list[str]]:
        return self.tokens(batch.source_ids)

    def target(self, data: AuditData, *, batch_size: int, max_source_tokens: int | None,
               label: str, origin: str, name: str | None) -> Seq2SeqTarget:
        """The target auditing ``data`` through this model: sources cut to the smaller of
        ``max_source_tokens`` and the model's position limit, batches on the model's
        device."""
        eos = self.eos_id
        if self.start_id is None or self.pad_id is None or eos is None:
            raise TargetError(f"{label}: config needs decoder_start_token_id, pad and eos ids")
        self.limit, truncation = source_limit(self.tokenizer, self.model.config, data.sources,
                                              max_source_tokens)
        where = input_device(self.model)
        return Seq2SeqTarget(
            name=name or label, model=self.model,
            batches=lambda: data.batches(batch_size, where, self.sources, self.outputs),
            greedy=self.greedy, teacher_forced=self.teacher_forced,
            source_embedding=_source_embedding(self.model), source_tokens=self.source_tokens,
            target_tokens=self.tokens, eos_id=eos, special_ids=self.special_ids,
            description=f"{type(self.model).__name__} from {origin or 'a loaded model'}",
            encode=self.encode, decode=self.decode, decode_states=self.decode_states,
            decode_step=self.decode_step, cached_decode=self.cached_decode, device=where,
            truncation=truncation,
            target_embedding=_decoder_embedding(self.model),
            unk_id=self.tokenizer.unk_token_id, decoding=self.decoding)


def _source_embedding(model: Any) -> nn.Module:
    """The module embedding the source: the encoder's own input embedding where it says
    which (FSMT's encoder only has ``embed_tokens``), else the model's."""
    encoder = model.get_encoder()
    try:
        return encoder.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        embed = getattr(encoder, "embed_tokens", None)
        return embed if isinstance(embed, nn.Module) else model.get_input_embeddings()


def _decoder_embedding(model: Any) -> nn.Module | None:
    """The module embedding the decoder's input tokens (FSMT's decoder only has
    ``embed_tokens``), or None when the decoder names none."""
    decoder = model.get_decoder()
    try:
        return decoder.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        embed = getattr(decoder, "embed_tokens", None)
        return embed if isinstance(embed, nn.Module) else None

