"""Tiny seq2seq models with known masking mistakes, as audit targets.

One dot-product cross-attention over embedded source tokens; the query at step t is the
embedding of the decoder input token, so teacher forcing the greedy output reproduces it.
``masking`` picks how padding is excluded:

- "correct": masked scores filled with -inf before the softmax;
- "after_softmax": the mask multiplies the softmax output, not renormalised (capture sees
  the softmax output, which has mass on padding);
- "zero_fill": masked scores filled with 0 instead of -inf;
- "wrong_axis": the softmax normalises over the query axis (use sources without padding: a
  padded key column would be all -inf); capture takes that axis as the keys, and the site's
  layout (``b k q``) shows the mistake;
- "wrong_axis_tapped": the same normalisation written by hand and exposed with
  ``attnaudit.tap``, which reads keys last: rows over the keys do not sum to one.

With "correct" masking, a source that is all padding has no eligible key: softmax over
all -inf gives NaN.
"""

from __future__ import annotations

import math

import torch
from torch import nn

import attnaudit
from attnaudit.targets.contract import Batch, Seq2SeqTarget

PAD, BOS, EOS = 0, 1, 2
VOCAB, DIM, STEPS = 8, 6, 4
SOURCES = ([3, 4, 5, 6, 7], [5, 3], [7, 7, 6], [4], [6, 5, 4, 3])
UNPADDED_SOURCES = ([3, 4, 5], [5, 3, 6], [7, 7, 6], [4, 4, 3])


class ToySeq2Seq(nn.Module):
    def __init__(self, masking: str = "correct") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.masking = masking
        self.src_embed = nn.Embedding(VOCAB, DIM)
        self.tgt_embed = nn.Embedding(VOCAB, DIM)
        self.out = nn.Linear(DIM, VOCAB)
        self.eval()

    def attend(self, queries: torch.Tensor, keys: torch.Tensor,
               valid: torch.Tensor) -> torch.Tensor:
        """queries (B, T, D), keys (B, n, D), valid (B, n) -> context (B, T, D)."""
        scores = queries @ keys.transpose(1, 2) / math.sqrt(DIM)
        allowed = valid[:, None, :]
        if self.masking == "after_softmax":
            weights = torch.softmax(scores, dim=-1) * allowed
        elif self.masking == "zero_fill":
            weights = torch.softmax(scores.masked_fill(~allowed, 0.0), dim=-1)
        elif self.masking == "wrong_axis":
            weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=1)
        elif self.masking == "wrong_axis_tapped":
            e = torch.exp(scores - scores.amax(1, keepdim=True))
            weights = attnaudit.tap("attend", e / e.sum(1, keepdim=True), kind="cross")
        else:
            weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        return weights @ keys

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """src (B, n), decoder inputs (B, T) -> logits (B, T, V)."""
        queries = self.tgt_embed(tgt_in.to(self.tgt_embed.weight.device))
        return self.out(self.attend(queries, self.src_embed(src), src != PAD) + queries)

    @torch.no_grad()
    def greedy(self, src: torch.Tensor) -> torch.Tensor:
        tgt_in = torch.full((src.shape[0], 1), BOS, device=src.device)
        for _ in range(STEPS):
            step = self(src, tgt_in)[:, -1].argmax(-1)
            tgt_in = torch.cat([tgt_in, step[:, None]], dim=1)
        return tgt_in[:, 1:]


def source_batch(sources: tuple[list[int], ...]) -> Batch:
    """Right-padded ids (B, n) and their mask; texts are the ids joined by spaces."""
    width = max(max(len(s) for s in sources), 1)
    ids = torch.tensor([s + [PAD] * (width - len(s)) for s in sources])
    return Batch(ids, ids != PAD, [" ".join(map(str, s)) for s in sources])


def make_target(masking: str = "correct", sources: tuple[list[int], ...] = SOURCES,
                batch_size: int = 3, *, labels: list[str] | None = None,
                name: str | None = None, description: str | None = None) -> Seq2SeqTarget:
    """``labels[i]`` names token id i (default ``t<i>``; VOCAB of them)."""
    model = ToySeq2Seq(masking)
    names = labels if labels is not None else [f"t{i}" for i in range(VOCAB)]

    def batches():
        for at in range(0, len(sources), batch_size):
            yield source_batch(sources[at : at + batch_size])

    def teacher_forced(batch: Batch, emitted: torch.Tensor) -> torch.Tensor:
        start = torch.full_like(emitted[:, :1], BOS)
        return model(batch.source_ids, torch.cat([start, emitted[:, :-1]], dim=1))

    def tokens(ids: torch.Tensor) -> list[list[str]]:
        return [[names[i] for i in row.tolist()] for row in ids]

    return Seq2SeqTarget(
        name=name or f"toy_{masking}",
        model=model,
        batches=batches,
        greedy=lambda batch: model.greedy(batch.source_ids),
        teacher_forced=teacher_forced,
        source_embedding=model.src_embed,
        source_tokens=lambda batch: tokens(batch.source_ids),
        target_tokens=tokens,
        eos_id=EOS,
        special_ids=(PAD,),
        kinds={"attend": "cross"},
        description=description or f"toy cross-attention, masking: {masking}",
    )


def correct() -> Seq2SeqTarget:
    return make_target("correct")


def after_softmax() -> Seq2SeqTarget:
    return make_target("after_softmax")


def zero_fill() -> Seq2SeqTarget:
    return make_target("zero_fill")


def wrong_axis() -> Seq2SeqTarget:
    return make_target("wrong_axis", UNPADDED_SOURCES)


def wrong_axis_tapped() -> Seq2SeqTarget:
    return make_target("wrong_axis_tapped", UNPADDED_SOURCES)


def nan_on_empty_source() -> Seq2SeqTarget:
    return make_target("correct", (*SOURCES, []))


def not_a_target() -> str:
    return "a string, not a Seq2SeqTarget"
