"""A hand-built seq2seq target small enough to audit in a second.

Dot-product cross-attention from target-token queries onto source-token embeddings, in a
plain ``attend`` method. ``leak=True`` masks after the softmax without renormalising, so
padding keys keep weight the softmax gave them (a known masked-mass failure). Token labels
and names are whatever the test passes, e.g. markup that must render as text.
"""

from __future__ import annotations

import torch
from torch import nn

from attnaudit.target import Batch, Seq2SeqTarget

PAD, EOS, BOS = 0, 1, 2
STEPS = 3


class TinyAttention(nn.Module):
    def __init__(self, vocab: int, dim: int = 8, leak: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.src_embed = nn.Embedding(vocab, dim, padding_idx=PAD)
        self.tgt_embed = nn.Embedding(vocab, dim)
        self.out = nn.Linear(dim, vocab)
        self.leak = leak

    def attend(self, query: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor):
        """query (B, T, d), keys (B, n, d), valid (B, n) -> context (B, T, d)."""
        scores = query @ keys.transpose(1, 2)
        if self.leak:
            weights = torch.softmax(scores, dim=-1) * valid[:, None, :]
        else:
            weights = torch.softmax(scores.masked_fill(~valid[:, None, :], float("-inf")), -1)
        return weights @ keys

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        query = self.tgt_embed(tgt_in)
        context = self.attend(query, self.src_embed(src), src != PAD)
        return self.out(context + query)


def make_tiny_target(labels: list[str], sources: list[list[int]], *, name: str = "tiny",
                     description: str = "", leak: bool = False) -> Seq2SeqTarget:
    """``labels[i]`` names token id i (0 pad, 1 EOS, 2 BOS); ``sources`` are id lists."""
    model = TinyAttention(len(labels), leak=leak).eval()
    width = max(len(s) for s in sources)
    ids = torch.tensor([s + [PAD] * (width - len(s)) for s in sources])
    texts = [" ".join(labels[i] for i in s) for s in sources]

    def batches():
        yield Batch(ids, ids != PAD, texts)

    def teacher_forced(batch: Batch, emitted: torch.Tensor) -> torch.Tensor:
        start = torch.full_like(emitted[:, :1], BOS)
        return model(batch.source_ids, torch.cat([start, emitted[:, :-1]], dim=1))

    @torch.no_grad()
    def greedy(batch: Batch) -> torch.Tensor:
        emitted = torch.full((len(batch), 1), BOS, dtype=torch.long)
        for _ in range(STEPS):
            logits = model(batch.source_ids, emitted)
            emitted = torch.cat([emitted, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        return emitted[:, 1:]

    def tokens(rows: torch.Tensor) -> list[list[str]]:
        return [[labels[i] for i in row.tolist()] for row in rows]

    return Seq2SeqTarget(
        name=name, model=model, batches=batches, greedy=greedy,
        teacher_forced=teacher_forced, source_embedding=model.src_embed,
        source_tokens=lambda batch: tokens(batch.source_ids), target_tokens=tokens,
        eos_id=EOS, special_ids=(PAD,), kinds={"attend": "cross"}, description=description)
