"""Train the small character-level BART on the date task and save it to ``model/``.

    python -m attnaudit_examples.date_transformer.train      # ~3 minutes on 2 idle CPU cores

Epochs take ~11 s on two idle cores; on a machine shared with other jobs they took up to
~150 s (14 minutes in all). Deterministic on CPU: two runs give bit-identical weights.

Same 8,000 training pairs as ``attnaudit_examples.date`` (seed 6050). AdamW 1e-3 (weight
decay 0.01), linear warmup over the first 5% of steps then linear decay to 0, batch 64,
gradient clip 1.0, dropout 0.1, label padding -100. Prints greedy exact match on the
first 400 unambiguous validation pairs after every epoch and on the 437 unambiguous test
pairs at the end, then writes model (safetensors), generation config and tokenizer with
``save_pretrained``.
"""

from __future__ import annotations

import random
import time

import torch
from transformers import PreTrainedTokenizerBase

from ..date.data import SEED, make_splits
from .model import (
    MODEL_DIR,
    build_model,
    build_tokenizer,
    exact_match,
    load_model,
)


def encode_pairs(
    tokenizer: PreTrainedTokenizerBase, pairs: list[tuple[str, str]]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Encode ``(source, iso)`` pairs for teacher-forced training.

    Returns ``input_ids`` and ``attention_mask`` ``(n, src_len + 1)``, ``labels`` ``(n, 11)``.

    Labels are the ISO characters followed by ``</s>``, padded with -100 (never needed:
    ISO dates are fixed-length).
    """
    src = tokenizer([s for s, _ in pairs], padding=True, return_tensors="pt")
    tgt = tokenizer([t for _, t in pairs], padding=True, return_tensors="pt")
    labels = tgt["input_ids"].masked_fill(tgt["attention_mask"] == 0, -100)
    return src["input_ids"], src["attention_mask"], labels


def main(epochs: int = 15, batch_size: int = 64, lr: float = 1e-3) -> None:
    """Train from scratch, report exact match, save to ``MODEL_DIR`` and check the reload."""
    torch.set_num_threads(2)
    torch.manual_seed(SEED)
    random.seed(SEED)
    torch.use_deterministic_algorithms(True)
    began = time.perf_counter()

    splits = make_splits()
    every = splits.train + splits.valid + splits.test
    tokenizer = build_tokenizer("".join(s + t for s, t in every))
    model = build_model(len(tokenizer))
    n_params = sum(p.numel() for p in model.parameters())
    print(f"vocabulary: {len(tokenizer)}  parameters: {n_params:,}")

    input_ids, attention_mask, labels = encode_pairs(tokenizer, splits.train)
    valid = splits.unambiguous("valid", 400)
    test = splits.unambiguous("test")

    steps_per_epoch = -(-len(splits.train) // batch_size)
    total = epochs * steps_per_epoch
    warmup = max(1, total // 20)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: min((step + 1) / warmup, max(0.0, (total - step) / (total - warmup))),
    )
    order_rng = torch.Generator().manual_seed(SEED)

    for epoch in range(1, epochs + 1):
        model.train()
        order = torch.randperm(len(splits.train), generator=order_rng)
        running = 0.0
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            mask = attention_mask[idx]
            width = int(mask.sum(1).max())
            loss = model(
                input_ids=input_ids[idx, :width], attention_mask=mask[:, :width], labels=labels[idx]
            ).loss
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            running += loss.item() * len(idx)
        em = exact_match(model, tokenizer, valid)
        print(
            f"epoch {epoch:2d}  loss {running / len(order):.4f}  valid exact match {em:.4f}"
            f"  ({time.perf_counter() - began:.0f}s)"
        )

    model.eval()
    print(f"test exact match (unambiguous, {len(test)}): {exact_match(model, tokenizer, test):.4f}")
    model.save_pretrained(MODEL_DIR)
    tokenizer.save_pretrained(MODEL_DIR)

    reloaded, retok = load_model(MODEL_DIR)
    print(f"reloaded test exact match: {exact_match(reloaded, retok, test):.4f}")
    print(f"saved to {MODEL_DIR}  total {time.perf_counter() - began:.0f}s")


if __name__ == "__main__":
    main()
