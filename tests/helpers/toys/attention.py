"""A tiny attentive seq2seq model with plain autograd inside, for attribution tests: an
embedding and tanh encoder, a decoder step whose query comes from the previous target token,
softmax attention over the source, logits from the context and the query."""

from __future__ import annotations

import torch
from torch import nn

from attnaudit.targets.contract import Batch, Seq2SeqTarget

PAD, BOS, EOS, VOCAB, DIM = 0, 1, 6, 7, 5


class TinyAttention(nn.Module):
    """Embedding -> tanh encoder; decoder step t: query from the previous target token,
    softmax attention over the source (in ``attend``), logits from [context; query].
    With ``shared`` the decoder embeds its tokens with the source embedding (a second call)."""

    def __init__(self, shared: bool = False, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(VOCAB, DIM)  # no padding_idx: the pad baseline is not zero
        self.tgt_embed = self.embed if shared else nn.Embedding(VOCAB, DIM)
        self.enc = nn.Linear(DIM, DIM)
        self.query = nn.Linear(DIM, DIM)
        self.out = nn.Linear(2 * DIM, VOCAB)
        self.detach_weights = False  # only the reference computations set it

    def attend(self, query: torch.Tensor, memory: torch.Tensor,
               valid: torch.Tensor) -> torch.Tensor:
        scores = (memory @ query[:, :, None]).squeeze(-1).masked_fill(~valid, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        if self.detach_weights:
            weights = weights.detach()
        return (weights[:, None, :] @ memory).squeeze(1)

    def from_embedding(self, embedded: torch.Tensor, valid: torch.Tensor,
                       tgt_in: torch.Tensor) -> torch.Tensor:
        memory = torch.tanh(self.enc(embedded))
        queries = torch.tanh(self.query(self.tgt_embed(tgt_in)))  # (B, T, d)
        logits = [self.out(torch.cat([self.attend(queries[:, t], memory, valid),
                                      queries[:, t]], -1))
                  for t in range(tgt_in.shape[1])]
        return torch.stack(logits, 1)

    def forward(self, src: torch.Tensor, valid: torch.Tensor,
                tgt_in: torch.Tensor) -> torch.Tensor:
        return self.from_embedding(self.embed(src), valid, tgt_in)


def decoder_inputs(emitted: torch.Tensor) -> torch.Tensor:
    return torch.cat([torch.full_like(emitted[:, :1], BOS), emitted[:, :-1]], 1)


def tiny_target(model: nn.Module) -> tuple[Seq2SeqTarget, Batch, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    # n == T, so a hook that replaced the decoder's call of a shared embedding too would
    # not fail on shapes but give other numbers
    src = torch.randint(2, EOS, (3, 4), generator=gen)
    src[1, 3:] = PAD
    src[2, 2:] = PAD
    batch = Batch(src, src != PAD, ["a", "b", "c"])
    emitted = torch.randint(2, EOS, (3, 4), generator=gen)
    emitted[2, 1] = EOS  # steps 2 and 3 of example 2 are padding

    def teacher_forced(b: Batch, em: torch.Tensor) -> torch.Tensor:
        return model(b.source_ids, b.source_mask, decoder_inputs(em))

    target = Seq2SeqTarget(
        name="tiny", model=model, batches=lambda: [batch], greedy=lambda b: emitted,
        teacher_forced=teacher_forced, source_embedding=model.embed,
        source_tokens=lambda b: [[str(i) for i in r] for r in b.source_ids.tolist()],
        target_tokens=lambda e: [[str(i) for i in r] for r in e.tolist()],
        eos_id=EOS, special_ids=(PAD,), kinds={"attend": "cross"})
    return target, batch, emitted
