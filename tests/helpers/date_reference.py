"""The date model's decoder written out from its parameters, for tests that need its
attention and outputs without going through capture, attnaudit or the model's own loop."""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnaudit_examples.date.data import BOS
from attnaudit_examples.date.model import TARGET_STEPS, DateAttentionModel

# (step, weights (B, n), memory (B, n, d)) -> context (B, d)
Read = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]


def weighted_read(step: int, weights: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
    return (weights[:, :, None] * memory).sum(1)


@torch.no_grad()
def hand_written_decode(model: DateAttentionModel, src: torch.Tensor, lengths: torch.Tensor,
                        tgt_in: torch.Tensor | None = None, steps: int = TARGET_STEPS,
                        read: Read = weighted_read
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Additive attention, LSTM cell and readout from the parameters.

    Teacher-forced on decoder inputs ``tgt_in`` (B, T), or greedy (each step's own argmax
    feeds the next) for ``steps`` steps. ``read`` turns each step's weights into the
    context (default: the weighted sum of the encoder states). Returns the weights
    (B, T, n), the output probabilities (B, T, V) and the argmax ids (B, T).
    """
    memory, valid, (h, c) = model.encode(src, lengths)
    keys = memory @ model.key_proj.weight.T
    prev = torch.full((src.shape[0],), BOS) if tgt_in is None else tgt_in[:, 0]
    n_steps = steps if tgt_in is None else tgt_in.shape[1]
    weights, probs, emitted = [], [], []
    for t in range(n_steps):
        scores = (torch.tanh(keys + (h @ model.query_proj.weight.T)[:, None])
                  @ model.score_vec.weight.T).squeeze(-1).masked_fill(~valid, float("-inf"))
        w = torch.exp(scores - scores.max(-1, keepdim=True).values)
        w = w / w.sum(-1, keepdim=True)
        context = read(t, w, memory)
        h, c = model.decoder(torch.cat([model.tgt_embed(prev), context], -1), (h, c))
        logits = model.out(torch.cat([h, context], -1))
        weights.append(w)
        probs.append(torch.softmax(logits, -1))
        emitted.append(logits.argmax(-1))
        if t + 1 < n_steps:
            prev = emitted[-1] if tgt_in is None else tgt_in[:, t + 1]
    return torch.stack(weights, 1), torch.stack(probs, 1), torch.stack(emitted, 1)
