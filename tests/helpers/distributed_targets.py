"""The bundled models in batches of four, so that a few examples make several batches to
deal out across ranks; and one that fails on rank 1 only."""

from __future__ import annotations

import os
import time

import torch

from attnaudit.targets.contract import Batch, Seq2SeqTarget
from attnaudit_examples.date.target import make_target as make_date_target
from attnaudit_examples.date_transformer.target import make_target as make_transformer_target

BATCH = 4


def date_lstm() -> Seq2SeqTarget:
    return make_date_target(batch_size=BATCH)


def date_transformer() -> Seq2SeqTarget:
    target = make_transformer_target()

    def batches():
        for batch in target.batches():
            for at in range(0, len(batch), BATCH):
                yield batch.select(torch.arange(at, min(at + BATCH, len(batch))))

    return target.with_options(batches=batches)


def date_lstm_failing_on_rank_1() -> Seq2SeqTarget:
    """The date model whose greedy decoding raises in the process of rank 1."""
    target = date_lstm()
    greedy = target.greedy

    def failing(batch: Batch) -> torch.Tensor:
        if os.environ.get("RANK") == "1":
            raise RuntimeError("deliberate failure in this rank's shard")
        return greedy(batch)

    return target.with_options(greedy=failing)


def date_lstm_stuck_on_rank_1() -> Seq2SeqTarget:
    """The date model whose greedy decoding stalls for a minute in the process of rank 1."""
    target = date_lstm()
    greedy = target.greedy

    def stuck(batch: Batch) -> torch.Tensor:
        if os.environ.get("RANK") == "1":
            time.sleep(60)
        return greedy(batch)

    return target.with_options(greedy=stuck)
