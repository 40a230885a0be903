"""The date suite on one process with 2 threads vs 2 torchrun processes with 1 thread each.

    python -m benchmarks.distributed [--limit 40] [--batch-size 10] [--quick]

Runs ``attnaudit intervene`` on the bundled date model (its first ``--limit`` sources in
batches of ``--batch-size``) three times, one after the other, from a fresh interpreter
each time: ``OMP_NUM_THREADS=2 python -m attnaudit intervene ...``,
``OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc_per_node 2 -m
attnaudit intervene ...`` (gloo, CPU), and, for reference, one process with one thread.
Prints the wall times (start-up, import and process-group set-up included), the speed-ups,
and the largest difference between the per-row tables of 1 x 2 and 2 x 1 (float32 sums
depend on the thread count; two ranks of one thread write the bytes of one process of one
thread: checked here, and in tests/runtime/test_torchrun.py).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from benchmarks.harness import load, parser, run_child

BATCH_SIZE = 10


def date_target():
    """The bundled date model in batches of ``ATTNAUDIT_BENCH_BATCH`` (the TARGET factory,
    ``benchmarks.distributed:date_target``, found from the checkout's root)."""
    from attnaudit_examples.date.target import make_target

    return make_target(batch_size=int(os.environ.get("ATTNAUDIT_BENCH_BATCH", BATCH_SIZE)))


def timed_run(argv: list[str], threads: int, batch_size: int) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "ATTNAUDIT_BENCH_BATCH": str(batch_size)}
    return run_child(argv, env).seconds


def _largest_difference(a: Path, b: Path) -> float:
    import pandas as pd

    left, right = pd.read_csv(a), pd.read_csv(b)
    if left.shape != right.shape:
        raise SystemExit(f"{a} and {b} hold different rows: {left.shape} vs {right.shape}")
    numeric = left.select_dtypes("number").columns
    return float((left[numeric] - right[numeric]).abs().max().max())


def main() -> None:
    options = parser(__spec__.name, __doc__)
    options.add_argument("--limit", type=int, default=40, help="sources audited")
    options.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    options.add_argument("--quick", action="store_true",
                         help="skip the adversarial search and integrated gradients")
    args = options.parse_args()
    print(load())
    with tempfile.TemporaryDirectory() as tmp:
        command = ["-m", "attnaudit", "intervene", f"{__spec__.name}:date_target",
                   "--limit", str(args.limit), *(["--quick"] if args.quick else [])]
        one = Path(tmp) / "one"
        two = Path(tmp) / "two"
        single = timed_run([sys.executable, *command, "--out", str(one)], 2, args.batch_size)
        ranks = timed_run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node", "2", *command, "--out", str(two)], 1,
                          args.batch_size)
        alone = timed_run([sys.executable, *command, "--out", str(Path(tmp) / "alone")], 1,
                          args.batch_size)
        difference = _largest_difference(one / "rows.csv", two / "rows.csv")
        same = (Path(tmp) / "alone" / "rows.csv").read_bytes() == (two / "rows.csv").read_bytes()
    batches = -(-args.limit // args.batch_size)
    print(f"date suite, {args.limit} sources in {batches} batches"
          f"{' (quick)' if args.quick else ''}; {load()} at the end")
    print(f"1 process x 2 threads:   {single:7.1f} s")
    print(f"2 processes x 1 thread:  {ranks:7.1f} s")
    print(f"1 process x 1 thread:    {alone:7.1f} s")
    print(f"speed-up of 2 x 1 over 1 x 2: {single / ranks:.2f}x (over 1 x 1: {alone / ranks:.2f}x)")
    print(f"rows.csv: 1 x 2 vs 2 x 1 largest difference {difference:.1e}; "
          f"1 x 1 and 2 x 1 identical: {same}")


if __name__ == "__main__":
    main()
