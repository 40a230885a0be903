"""The date model as an audit target (the bundled default of ``attnaudit report``/``check``).

Audit data: the first 400 unambiguous validation sources, as in the seed's alignment
check; expectation: the first four emitted characters (the year) read the source year.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from attnaudit.targets.contract import Batch, Expectation, Seq2SeqTarget

from .data import (
    BOS,
    EOS,
    PAD,
    SEED,
    YEAR_CHARS,
    encode_sources,
    make_splits,
    vocabularies,
    year_span,
)
from .gold import gold_lines
from .model import TARGET_STEPS, load_model

AUDIT_SOURCES = 400


def year_keys(batch: Batch, emitted: torch.Tensor) -> torch.Tensor:
    """Bool (B, n): True on each source's year characters."""
    keys = torch.zeros_like(batch.source_mask)
    for row, text in enumerate(batch.texts):
        keys[row, list(year_span(text))] = True
    return keys


def decoder_inputs(emitted: torch.Tensor) -> torch.Tensor:
    """``<s>`` then the emitted ids but the last: (B, T) -> (B, T)."""
    return torch.cat([torch.full_like(emitted[:, :1], BOS), emitted[:, :-1]], dim=1)


def make_target(limit: int = AUDIT_SOURCES, batch_size: int = 100) -> Seq2SeqTarget:
    splits = make_splits()
    src_vocab, tgt_vocab = vocabularies(splits)
    model = load_model()
    pairs = splits.unambiguous("valid", limit)

    def batches() -> Iterator[Batch]:
        for at in range(0, len(pairs), batch_size):
            chunk = pairs[at : at + batch_size]
            texts = [s for s, _ in chunk]
            src, lengths = encode_sources(src_vocab, texts)
            yield Batch(src, src != PAD, texts, [t for _, t in chunk], {"lengths": lengths})

    def greedy(batch: Batch) -> torch.Tensor:
        return model.greedy(batch.source_ids, batch.inputs["lengths"], TARGET_STEPS)

    def teacher_forced(batch: Batch, emitted: torch.Tensor) -> torch.Tensor:
        return model(batch.source_ids, batch.inputs["lengths"], decoder_inputs(emitted))

    def encode(batch: Batch) -> tuple[torch.Tensor, ...]:
        memory, valid, (h, c) = model.encode(batch.source_ids, batch.inputs["lengths"])
        return memory, valid, h, c, model.key_proj(memory)

    def decode(batch: Batch, encoded: tuple[torch.Tensor, ...],
               emitted: torch.Tensor) -> torch.Tensor:
        """The decoder half of ``model.forward``, from a cached encoder state."""
        memory, valid, h, c, keys = encoded
        state, logits = (h, c), []
        for prev in decoder_inputs(emitted).unbind(1):
            step_logits, state = model.step(prev, state, memory, keys, valid)
            logits.append(step_logits)
        return torch.stack(logits, dim=1)

    def decode_states(batch: Batch, encoded: tuple[torch.Tensor, ...],
                      emitted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The LSTM state (h, c) before every step: each (B, T, d), unedited."""
        memory, valid, h, c, keys = encoded
        state, hs, cs = (h, c), [], []
        for prev in decoder_inputs(emitted).unbind(1):
            hs.append(state[0])
            cs.append(state[1])
            _, state = model.step(prev, state, memory, keys, valid)
        return torch.stack(hs, dim=1), torch.stack(cs, dim=1)

    def decode_step(batch: Batch, encoded: tuple[torch.Tensor, ...],
                    states: tuple[torch.Tensor, torch.Tensor], emitted: torch.Tensor,
                    step: int) -> torch.Tensor:
        """Logits (B, V) at ``step`` from the state before it."""
        memory, valid, _, _, keys = encoded
        prev = decoder_inputs(emitted)[:, step]
        logits, _ = model.step(prev, (states[0][:, step], states[1][:, step]), memory, keys,
                               valid)
        return logits

    def source_tokens(batch: Batch) -> list[list[str]]:
        return [[src_vocab.itos[i] for i in row.tolist()] for row in batch.source_ids]

    def target_tokens(emitted: torch.Tensor) -> list[list[str]]:
        return [[tgt_vocab.itos[i] for i in row.tolist()] for row in emitted]

    return Seq2SeqTarget(
        name="date",
        model=model,
        batches=batches,
        greedy=greedy,
        teacher_forced=teacher_forced,
        source_embedding=model.src_embed,
        target_embedding=model.tgt_embed,
        source_tokens=source_tokens,
        target_tokens=target_tokens,
        eos_id=EOS,
        special_ids=(PAD,),
        kinds={"attend": "cross"},
        expectations=(Expectation("source year", year_keys, rows=YEAR_CHARS),),
        seed=SEED,
        gold_alignments=gold_lines(target_tokens, EOS),
        encode=encode,
        decode=decode,
        decode_states=decode_states,
        decode_step=decode_step,
        description=(
            "LSTM encoder-decoder with additive (Bahdanau) cross-attention normalising "
            "free-form English dates to ISO 8601 (examples/date); audit data: unambiguous "
            "validation sources, in order."
        ),
    )
