"""A seq2seq toy whose cross-attention is an ``nn.MultiheadAttention`` (its output projection
called inside the functional, as torch does), with a padded batch of 4 sources."""

from __future__ import annotations

import torch
from torch import nn

from attnaudit.targets.contract import Batch, Seq2SeqTarget

PAD, BOS, EOS, VOCAB, DIM, HEADS = 0, 1, 6, 7, 8, 2


class MhaSeq2Seq(nn.Module):
    """Embedding -> tanh encoder; decoder step t: query from the previous target token,
    ``nn.MultiheadAttention`` over the source, logits from [context; query]."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, DIM)
        self.tgt_embed = nn.Embedding(VOCAB, DIM)
        self.enc = nn.Linear(DIM, DIM)
        self.attn = nn.MultiheadAttention(DIM, HEADS, batch_first=True)
        self.out = nn.Linear(2 * DIM, VOCAB)
        with torch.no_grad():  # weights large enough for the controls to move the output
            for p in self.parameters():
                p.mul_(3.0)

    def forward(self, src: torch.Tensor, valid: torch.Tensor, tgt_in: torch.Tensor
                ) -> torch.Tensor:
        memory = torch.tanh(self.enc(self.embed(src)))
        query = torch.tanh(self.tgt_embed(tgt_in))
        context, _ = self.attn(query, memory, memory, key_padding_mask=~valid)
        return self.out(torch.cat([context, query], -1))


def mha_target() -> tuple[Seq2SeqTarget, MhaSeq2Seq]:
    model = MhaSeq2Seq().eval()
    gen = torch.Generator().manual_seed(2)
    src = torch.randint(2, EOS, (4, 5), generator=gen)
    src[1, 3:] = PAD
    src[3, 4:] = PAD
    batch = Batch(src, src != PAD, ["a", "b", "c", "d"])
    emitted = torch.randint(2, EOS, (4, 3), generator=gen)

    def teacher_forced(b: Batch, em: torch.Tensor) -> torch.Tensor:
        tgt_in = torch.cat([torch.full_like(em[:, :1], BOS), em[:, :-1]], 1)
        return model(b.source_ids, b.source_mask, tgt_in)

    target = Seq2SeqTarget(
        name="mha", model=model, batches=lambda: [batch], greedy=lambda b: emitted,
        teacher_forced=teacher_forced, source_embedding=model.embed,
        source_tokens=lambda b: [[str(i) for i in r] for r in b.source_ids.tolist()],
        target_tokens=lambda e: [[str(i) for i in r] for r in e.tolist()],
        eos_id=EOS, special_ids=(PAD,), kinds={"attn": "cross"})
    return target, model
