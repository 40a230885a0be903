"""The date model's greedy decoder written out from its parameters, for tests that need
its attention and output without going through capture or the model's own loop."""

from __future__ import annotations

import torch

from examples.date.data import BOS
from examples.date.model import TARGET_STEPS, DateAttentionModel


@torch.no_grad()
def hand_written_greedy(model: DateAttentionModel, src: torch.Tensor, lengths: torch.Tensor,
                        steps: int = TARGET_STEPS) -> tuple[torch.Tensor, torch.Tensor]:
    """Additive attention, LSTM cell and readout from the parameters; each step's own argmax
    feeds the next. Returns the weights of every step (B, steps, n) and the emitted ids
    (B, steps)."""
    memory, valid, (h, c) = model.encode(src, lengths)
    keys = memory @ model.key_proj.weight.T
    prev = torch.full((src.shape[0],), BOS)
    weights, emitted = [], []
    for _ in range(steps):
        scores = (torch.tanh(keys + (h @ model.query_proj.weight.T)[:, None])
                  @ model.score_vec.weight.T).squeeze(-1).masked_fill(~valid, float("-inf"))
        w = torch.exp(scores - scores.max(-1, keepdim=True).values)
        w = w / w.sum(-1, keepdim=True)
        context = (w[:, :, None] * memory).sum(1)
        h, c = model.decoder(torch.cat([model.tgt_embed(prev), context], -1), (h, c))
        prev = model.out(torch.cat([h, context], -1)).argmax(-1)
        weights.append(w)
        emitted.append(prev)
    return torch.stack(weights, 1), torch.stack(emitted, 1)
