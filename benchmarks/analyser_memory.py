"""Streaming analysers keep memory flat: peak RSS at 10x the rows vs 1x, and rows per second.

    python -m benchmarks.analyser_memory [--examples 100000]

Each size runs in a fresh child process that streams synthetic attention
(examples x 100 query rows x 64 keys, single head, 10% padded keys) in batches of 1,000
examples through the entropy, masking and numerics analysers, then computes the summary.
Prints peak RSS of both sizes (each child's own), their ratio (target <= 1.2) and analyser
throughput.
"""

from __future__ import annotations

import argparse
import json
import time

from benchmarks.harness import load, parser, python_module, run_child

QUERIES, KEYS, BATCH = 100, 64, 1000


def stream(examples: int) -> dict[str, float]:
    import torch

    from attnaudit.analysis import EntropyAnalyser, MaskingAnalyser, NumericsAnalyser
    from attnaudit.analysis.base import AttentionRows

    torch.manual_seed(0)
    analysers = [EntropyAnalyser(), MaskingAnalyser(), NumericsAnalyser()]
    eligible = torch.ones(BATCH, 1, 1, KEYS, dtype=torch.bool)
    eligible[::10, ..., KEYS - 8:] = False
    busy = 0.0
    for start in range(0, examples, BATCH):
        size = min(BATCH, examples - start)
        scores = torch.randn(size, 1, QUERIES, KEYS).masked_fill(~eligible[:size], float("-inf"))
        rows = AttentionRows("bench", "cross", scores.softmax(-1),
                             eligible[:size].expand(size, 1, QUERIES, KEYS))
        began = time.perf_counter()
        for analyser in analysers:
            analyser.update(rows)
        busy += time.perf_counter() - began
    summaries = [a.compute() for a in analysers]
    return {"rows": examples * QUERIES, "seconds": busy,
            "summary_rows": sum(len(s) for s in summaries)}


def main() -> None:
    options = parser(__spec__.name, __doc__)
    options.add_argument("--examples", type=int, default=100_000, help="examples at 10x")
    options.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = options.parse_args()
    if args.child is not None:
        print(json.dumps(stream(args.child)))
        return
    print(load())
    results = {}
    for examples in (args.examples // 10, args.examples):
        child = run_child(python_module(__spec__.name, "--child", str(examples)))
        results[examples] = {**json.loads(child.stdout.strip().splitlines()[-1]),
                             "peak_mib": child.peak_rss_mib}
    small, large = results[args.examples // 10], results[args.examples]
    print(f"{'rows':>12}{'peak RSS MiB':>14}{'rows/s':>14}{'summary rows':>14}")
    for r in (small, large):
        print(f"{r['rows']:>12,}{r['peak_mib']:>14.1f}{r['rows'] / r['seconds']:>14,.0f}"
              f"{r['summary_rows']:>14}")
    print(f"peak RSS ratio at 10x rows: {large['peak_mib'] / small['peak_mib']:.3f} "
          f"(target <= 1.2); {load()}")


if __name__ == "__main__":
    main()
