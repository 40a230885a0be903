"""The cost of value-norm contributions + ALTI relative to one teacher-forced pass.

    python -m benchmarks.contributions [--sources 200] [--rounds 5] [--marian-sources 16]
                                       [--marian-steps 16] [--no-marian]

For each model, every batch is decoded greedily once (not timed); then, side by side and
alternating which runs first (medians of ``--rounds``): one teacher-forced pass of the whole
data under ``torch.no_grad()``, and :func:`attnaudit.contributions.contributions` on the same
batches (the traced pass with values, the output projections found by role, value norms per
head and head-summed, ALTI's per-site decomposition with its re-sum check) followed by the
ALTI+ composition. Prints the ratio (target <= 3) and every site's re-sum check.

Models: the bundled date BART (2 + 2 layers, d_model 64) on the first ``--sources`` audit
sources, and the opus-mt-en-de-sized Marian of :mod:`benchmarks.real_size` (6 + 6 layers,
d_model 512, 58,101-word vocabulary, random weights; saved to a temporary folder) on
``--marian-sources`` seeded sources with ``--marian-steps`` greedy steps.

The machine may be shared: only the side-by-side ratios are meaningful.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch

from attnaudit.contributions import alti_plus, contributions
from attnaudit.targets.contract import Seq2SeqTarget
from benchmarks.harness import alternating, banner, load, parser


def _decoded(target: Seq2SeqTarget, limit: int) -> list[tuple[object, torch.Tensor]]:
    with torch.no_grad():
        return [(batch, target.greedy(batch)) for batch in target.iter_batches(limit)]


def compare(target: Seq2SeqTarget, limit: int, rounds: int) -> tuple[float, float, list]:
    """(teacher-forced seconds, contributions seconds, the last run's checks)."""
    work = _decoded(target, limit)
    checks: list = []

    def forward() -> float:
        start = time.perf_counter()
        with torch.no_grad():
            for batch, emitted in work:
                target.teacher_forced(batch, emitted)
        return time.perf_counter() - start

    def measured() -> float:
        checks.clear()
        start = time.perf_counter()
        for batch, emitted in work:
            result = contributions(target, batch, emitted)
            alti_plus(result)
            checks.extend(result.checks)
        return time.perf_counter() - start

    measured()  # warm-up: the one-example site discovery pass is made once per model
    plain, costly = alternating(forward, measured, rounds)
    return plain, costly, checks


def report(name: str, target: Seq2SeqTarget, limit: int, rounds: int) -> None:
    plain, costly, checks = compare(target, limit, rounds)
    print(f"{name}: teacher-forced pass {plain:.3f} s, value norms + ALTI(+) {costly:.3f} s, "
          f"ratio {costly / plain:.2f} (target <= 3)   [{load()}]")
    worst: dict[str, float] = {}
    for check in checks:
        worst[check.site] = max(worst.get(check.site, 0.0), check.value or 0.0)
    failing = sorted({c.site for c in checks if c.status != "pass"})
    print(f"  re-sum check: {len(worst)} sites, largest relative error "
          f"{max(worst.values()):.1e}, failing: {failing or 'none'}")


def main() -> None:
    options = parser(__spec__.name, __doc__)
    options.add_argument("--sources", type=int, default=200)
    options.add_argument("--rounds", type=int, default=5)
    options.add_argument("--marian-sources", type=int, default=16)
    options.add_argument("--marian-steps", type=int, default=16)
    options.add_argument("--marian-batch-size", type=int, default=8)
    options.add_argument("--no-marian", action="store_true")
    args = options.parse_args()
    print(banner())
    from attnaudit_examples.date_transformer.target import make_target

    report("date BART", make_target(), args.sources, args.rounds)
    if args.no_marian:
        return
    from benchmarks.real_size import build_checkpoint, load_marian, write_sources

    with tempfile.TemporaryDirectory() as folder:
        directory, data = Path(folder) / "marian", Path(folder) / "sources.txt"
        build_checkpoint(directory)
        write_sources(data, args.marian_sources)
        args.batch_size, args.steps = args.marian_batch_size, args.marian_steps
        report("Marian (opus-mt-en-de size)", load_marian(directory, data, args),
               args.marian_sources, args.rounds)


if __name__ == "__main__":
    main()
