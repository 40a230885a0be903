"""Decoder-only (causal) language models as audit targets: prompt -> continuation.

:func:`causal_lm_target` builds the same :class:`~attnaudit.target.Seq2SeqTarget` the
protocols use from a Hugging Face causal LM (GPT-2, Llama ...) and its tokenizer;
:func:`attnaudit.target.from_hf` calls it for a checkpoint whose config is not an
encoder-decoder. The mapping:

- the *source* is the prompt, left-padded as Hugging Face batches it: ``source_ids`` (B, P),
  ``source_mask`` True on real tokens; prompts longer than the limit keep their last tokens;
- the *output* is the greedy continuation of at most ``max_new_tokens`` tokens, ending at
  the first end-of-sequence token; ``teacher_forced`` runs prompt + continuation once, and
  the row at position ``P-1 + t`` gives the logits of continuation token ``t``;
- the model's self-attention is presented to capture as two views per layer
  (:mod:`attnaudit.capturing.views`): ``:cross``, the continuation rows over the prompt
  keys (renormalised over the prompt), and ``:self``, the same rows over the prompt's last
  token and the generated prefix (renormalised over those, causal);
- ``source_embedding`` is the model's input embedding, called on the prompt first in every
  teacher-forced pass, so attribution and leave-one-out see the prompt positions.

Eligible prompt keys come from the attention mask (left padding is out) and the special
tokens; causality holds by construction (every prompt key precedes every continuation row).
There is no encoder to reuse, so an edited step re-runs prompt and prefix.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from attnaudit.capturing.views import prompt_views
from attnaudit.target import Batch, Seq2SeqTarget, TargetError, _source_limit


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


def causal_lm_target(model: nn.Module, tokenizer: Any, sources: list[str],
                     references: list[str] | None, *, batch_size: int, max_new_tokens: int,
                     max_source_tokens: int | None, label: str, origin: str,
                     name: str | None) -> Seq2SeqTarget:
    """A prompt -> continuation target for a loaded causal LM (see the module docstring).

    ``sources`` are the prompts; ``references`` optional reference continuations. Prompts
    are cut to the smaller of ``max_source_tokens`` and the model's position limit less
    ``max_new_tokens``.
    """
    config = model.config
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else config.eos_token_id
    if isinstance(eos, list | tuple):
        eos = eos[0] if eos else None
    pad = next((i for i in (tokenizer.pad_token_id, config.pad_token_id) if i is not None), eos)
    if eos is None:
        raise TargetError(f"{label}: a causal LM target needs an end-of-sequence id "
                          "(tokenizer.eos_token_id or config.eos_token_id)")
    limit, truncation = _source_limit(tokenizer, config, sources, max_source_tokens,
                                      reserved=max_new_tokens)
    if limit is not None:
        truncation += " (a cut prompt keeps its last tokens)"
    where = next(model.parameters()).device
    embed = model.get_input_embeddings()
    fast = bool(getattr(tokenizer, "is_fast", False))  # offsets: word-level tables

    def batches() -> Iterator[Batch]:
        for at in range(0, len(sources), batch_size):
            texts = sources[at : at + batch_size]
            enc = tokenizer(texts, return_offsets_mapping=fast)
            ids = left_padded(enc["input_ids"], pad, limit)
            mask = left_padded([[True] * len(row) for row in enc["input_ids"]], False, limit)
            inputs = {"offsets": left_padded(enc["offset_mapping"], (0, 0), limit)} if fast else {}
            yield Batch(ids.to(where), mask.to(where), texts,
                        None if references is None else references[at : at + batch_size],
                        inputs)

    @torch.no_grad()
    def greedy(batch: Batch) -> torch.Tensor:
        out = model.generate(input_ids=batch.source_ids, attention_mask=batch.source_mask.long(),
                             do_sample=False, num_beams=1, max_new_tokens=max_new_tokens,
                             pad_token_id=pad, eos_token_id=eos)
        return out[:, batch.source_ids.shape[1]:]

    def teacher_forced(batch: Batch, emitted: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, V): prompt + emitted[:, :-1] in one pass, the prompt embedded
        first; position ids count real tokens only, as generate() sets them."""
        prompt = batch.source_ids.shape[1]
        prefix = emitted[:, :-1]
        embedded = torch.cat([embed(batch.source_ids), embed(prefix)], dim=1)
        mask = torch.cat([batch.source_mask.long(), torch.ones_like(prefix)], dim=1)
        positions = (mask.cumsum(-1) - 1).clamp_min(0)
        with prompt_views(prompt):
            out = model(inputs_embeds=embedded, attention_mask=mask, position_ids=positions,
                        use_cache=False)
        return out.logits[:, prompt - 1:]

    def tokens(ids: torch.Tensor) -> list[list[str]]:
        return [tokenizer.convert_ids_to_tokens(row.tolist()) for row in ids]

    specials = tuple(sorted({i for i in (pad, eos, tokenizer.bos_token_id,
                                         tokenizer.cls_token_id, tokenizer.sep_token_id)
                             if i is not None}))
    return Seq2SeqTarget(
        name=name or label,
        model=model,
        batches=batches,
        greedy=greedy,
        teacher_forced=teacher_forced,
        source_embedding=embed,
        source_tokens=lambda batch: tokens(batch.source_ids),
        target_tokens=tokens,
        eos_id=eos,
        special_ids=specials,
        description=(f"{type(model).__name__} (decoder-only) from "
                     f"{origin or 'a loaded model'}: {len(sources)} prompts, greedy "
                     f"continuations of at most {max_new_tokens} tokens; cross-attention is "
                     "the continuation's attention over the prompt, renormalised over the "
                     "prompt"),
        device=where,
        truncation=truncation,
    )
