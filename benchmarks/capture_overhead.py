"""Capture overhead: the same work with and without ``attnaudit.capture``, interleaved.

    python -m benchmarks.capture_overhead [--rounds 15]

Workloads (weights-only capture, no scores/values kept, under ``torch.no_grad()``):
  date        the LSTM date model decoding 400 validation sources greedily (softmax path)
  bart        the date_transformer BART teacher-forced at batch 64 (SDPA path, 6 sites)

Each round runs both variants back to back, alternating which goes first, so drift on a
shared machine hits both alike. Prints the median time of each and their ratio (target
<= 1.05 for capture / plain).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

import attnaudit
from attnaudit_examples.date.data import encode_sources, make_splits, vocabularies
from attnaudit_examples.date.model import load_model
from benchmarks.harness import alternating, banner, load, parser


def date_workload() -> tuple[torch.nn.Module, Callable[[], object]]:
    splits = make_splits()
    src_vocab, _ = vocabularies(splits)
    sources = [s for s, _ in splits.unambiguous("valid", 400)]
    src, lengths = encode_sources(src_vocab, sources)
    model = load_model()
    return model, lambda: model.greedy(src, lengths)


def bart_workload() -> tuple[torch.nn.Module, Callable[[], object]]:
    from attnaudit_examples.date_transformer.model import load_model as load_bart

    model, tokenizer = load_bart()
    splits = make_splits()
    pairs = splits.valid[:64]
    enc = tokenizer([s for s, _ in pairs], return_tensors="pt", padding=True)
    labels = tokenizer([t for _, t in pairs], return_tensors="pt", padding=True).input_ids
    return model, lambda: model(**enc, labels=labels).logits


def measure(model: torch.nn.Module, work: Callable[[], object], rounds: int) -> tuple[float, ...]:
    def plain() -> float:
        start = time.perf_counter()
        work()
        return time.perf_counter() - start

    def captured() -> float:
        start = time.perf_counter()
        with attnaudit.capture(model) as cap:
            work()
        for record in cap.records.values():
            _ = record.weights  # stacking the calls is part of the cost
        return time.perf_counter() - start

    with torch.no_grad():
        plain(), captured()  # warm up
        p, c = alternating(plain, captured, rounds)
    return p, c, c / p


def main() -> None:
    options = parser(__spec__.name, __doc__)
    options.add_argument("--rounds", type=int, default=15)
    args = options.parse_args()
    torch.manual_seed(0)
    print(f"{banner()}, {args.rounds} rounds")
    print(f"{'workload':<44}{'plain ms':>10}{'capture ms':>12}{'ratio':>8}")
    for label, build in (("date LSTM, greedy, 400 sources (softmax)", date_workload),
                         ("date BART, teacher-forced, batch 64 (sdpa)", bart_workload)):
        p, c, ratio = measure(*build(), args.rounds)
        print(f"{label:<44}{p * 1e3:>10.2f}{c * 1e3:>12.2f}{ratio:>8.3f}")
    print(f"{load()} at the end")


if __name__ == "__main__":
    main()
