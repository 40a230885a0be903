"""Hand-built seq2seq models with known answers, wrapped as audit targets.

ToyPointer: one additive-free cross-attention read per decoder step. Source token ids pick a
fixed score and a fixed value vector; the context is ``weights @ values`` and the logits are
``context @ readout + step bias``. With ``ignore=True`` the logits do not read the context,
so no attention edit can change the output. ``seen``, when a list, receives the weights
(B, n) each ``attend`` call actually reads: after an edit, the edited ones.
"""

from __future__ import annotations

import torch
from torch import nn

from attnaudit.targets.contract import Batch, Seq2SeqTarget

PAD, VOCAB_SRC, VOCAB_TGT, EOS = 0, 6, 3, 99


class ToyPointer(nn.Module):
    def __init__(self, scores: list[float], values: list[list[float]], ignore: bool = False,
                 readout_scale: float = 1.0) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB_SRC, 4)
        self.scores = nn.Parameter(torch.tensor(scores))
        self.values = nn.Parameter(torch.tensor(values))
        self.readout = nn.Parameter(torch.eye(VOCAB_TGT) * readout_scale)
        self.ignore = ignore
        self.seen: list[torch.Tensor] | None = None

    def attend(self, src: torch.Tensor) -> torch.Tensor:
        """(B, n) -> context (B, VOCAB_TGT)."""
        emb = self.embed(src)  # only so the source embedding call exists
        scores = self.scores[src] + 0.0 * emb.sum(-1)
        scores = scores.masked_fill(src == PAD, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        if self.seen is not None:
            self.seen.append(weights.detach().clone())
        return torch.bmm(weights[:, None, :], self.values[src]).squeeze(1)

    def forward(self, src: torch.Tensor, steps: int) -> torch.Tensor:
        out = []
        for t in range(steps):
            context = self.attend(src)
            bias = torch.full((src.shape[0], VOCAB_TGT), 0.1 * t)
            out.append(bias if self.ignore else context @ self.readout + bias)
        return torch.stack(out, dim=1)


def toy_target(model: ToyPointer, sources: list[list[int]], steps: int = 3,
               batch_size: int | None = None) -> Seq2SeqTarget:
    """Batches of ``batch_size`` sources (default all), each padded to its own longest."""
    size = batch_size or len(sources)

    def batches():
        for at in range(0, len(sources), size):
            chunk = sources[at : at + size]
            n = max(len(s) for s in chunk)
            src = torch.tensor([s + [PAD] * (n - len(s)) for s in chunk])
            yield Batch(src, src != PAD, [str(s) for s in chunk])

    def greedy(batch: Batch) -> torch.Tensor:
        with torch.no_grad():
            return model(batch.source_ids, steps).argmax(-1)

    return Seq2SeqTarget(
        name="toy", model=model, batches=batches, greedy=greedy,
        teacher_forced=lambda batch, emitted: model(batch.source_ids, emitted.shape[1]),
        source_embedding=model.embed,
        source_tokens=lambda batch: [[str(i) for i in r] for r in batch.source_ids.tolist()],
        target_tokens=lambda e: [[str(i) for i in r] for r in e.tolist()],
        eos_id=EOS, special_ids=(PAD,), kinds={"attend": "cross"}, seed=11)


# Token 1 carries almost all weight and a value pointing at class 0; the others point
# weakly at class 1.
DOMINATED_SCORES = [0.0, 8.0, 0.0, 0.2, 0.4, 0.1]
DOMINATED_VALUES = [[0, 0, 0], [6, 0, 0], [0, 1, 0], [0, 1.2, 0], [0, 0.9, 0.1], [0, 1, 0.2]]
SOURCES = [[1, 2, 3, 4], [2, 1, 5, 3, 4], [5, 4, 1]]


def dominated_target(ignore: bool = False) -> Seq2SeqTarget:
    model = ToyPointer(DOMINATED_SCORES, DOMINATED_VALUES, ignore=ignore).eval()
    return toy_target(model, SOURCES)


def toy_probs(values: torch.Tensor, src: list[int], weights: torch.Tensor,
              step: int) -> torch.Tensor:
    """Independent output of ToyPointer for given weights over ``src`` (no padding)."""
    context = weights @ values[torch.tensor(src)]
    return torch.softmax(context + 0.1 * step, -1)


# Orders disagree: token 2 has a low score but the value that carries class 0, so removing
# keys by attention and by gradient flips the output after different numbers of keys.
MIXED_SCORES = [0.0, 2.0, 0.5, 1.0, 1.2, 0.8]
MIXED_VALUES = [[0, 0, 0], [1.0, 0, 0.3], [4.0, 0, 0], [0, 1.6, 0], [0, 1.2, 0.5],
                [0.2, 0.5, 1.5]]
MIXED_SOURCES = [[1, 2, 3, 4], [2, 1, 5, 3, 4], [5, 4, 1], [3, 2, 5, 1]]


def mixed_target(batch_size: int | None = None) -> Seq2SeqTarget:
    model = ToyPointer(MIXED_SCORES, MIXED_VALUES).eval()
    return toy_target(model, MIXED_SOURCES, batch_size=batch_size)

