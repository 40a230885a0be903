"""Train a date model with the textbook schedule and save its checkpoint.

    python -m attnaudit_examples.date.train            # the attention model, ~2 min on 2 cores
    python -m attnaudit_examples.date.train baseline   # the seed's no-attention baseline

Seed 6050, Adam 1e-3, batch 128, 25 epochs, teacher forcing, gradient clip 5; the same
data, split and loop for both models.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn

from .baseline import BASELINE_CHECKPOINT, DateBaselineModel
from .data import (
    SEED,
    CharVocab,
    encode_sources,
    encode_targets,
    make_splits,
    vocabularies,
)
from .model import CHECKPOINT, DateAttentionModel

DateModel = DateAttentionModel | DateBaselineModel
MODELS: dict[str, tuple[type[DateModel], Path]] = {
    "attention": (DateAttentionModel, CHECKPOINT),
    "baseline": (DateBaselineModel, BASELINE_CHECKPOINT),
}


def exact_match(model: DateModel, pairs: list[tuple[str, str]], src_vocab: CharVocab,
                tgt_vocab: CharVocab) -> float:
    """Share of ``(source, iso)`` pairs that ``model.greedy`` decodes to ``iso`` exactly."""
    src, lengths = encode_sources(src_vocab, [s for s, _ in pairs])
    emitted = model.greedy(src, lengths)
    decoded = [tgt_vocab.decode(row.tolist()) for row in emitted]
    hits = sum(d == t for d, (_, t) in zip(decoded, pairs, strict=True))
    return hits / len(pairs)


def main(kind: str = "attention", epochs: int = 25, batch_size: int = 128,
         checkpoint: Path | None = None) -> None:
    """Train ``MODELS[kind]`` and save it to ``checkpoint`` (default: its committed path)."""
    model_class, default_checkpoint = MODELS[kind]
    checkpoint = checkpoint or default_checkpoint
    torch.manual_seed(SEED)
    splits = make_splits()
    src_vocab, tgt_vocab = vocabularies(splits)
    model = model_class(len(src_vocab), len(tgt_vocab))
    print(f"parameters: {sum(p.numel() for p in model.parameters()):,}")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    src_all, len_all = encode_sources(src_vocab, [s for s, _ in splits.train])
    tgt_all = encode_targets(tgt_vocab, [t for _, t in splits.train])
    valid = splits.unambiguous("valid", 400)
    for epoch in range(1, epochs + 1):
        model.train()
        order = torch.randperm(len(splits.train))
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            width = int(len_all[idx].max())
            logits = model(src_all[idx, :width], len_all[idx], tgt_all[idx, :-1])
            loss = loss_fn(logits.reshape(-1, logits.shape[-1]), tgt_all[idx, 1:].reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
        model.eval()
        print(f"epoch {epoch:2d}  loss {loss.item():.4f}  "
              f"valid exact match {exact_match(model, valid, src_vocab, tgt_vocab):.2%}")
    test = splits.unambiguous("test")
    print(f"test exact match ({len(test)} unambiguous): "
          f"{exact_match(model, test, src_vocab, tgt_vocab):.2%}")
    torch.save(model.state_dict(), checkpoint)
    print(f"saved {checkpoint}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m attnaudit_examples.date.train",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", choices=list(MODELS), default="attention")
    main(parser.parse_args().model)
