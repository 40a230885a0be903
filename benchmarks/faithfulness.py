"""The faithfulness protocol's cost per example, as a ratio to one teacher-forced pass.

    python -m benchmarks.faithfulness [--sources 3] [--marian-sources 2] [--steps 8]
                                      [--rounds 3] [--full] [--no-marian]

On the bundled date BART and on a Marian with opus-mt-en-de's dimensions (random weights,
built locally as :mod:`benchmarks.real_size` builds it; nothing is downloaded), per batch:
the reference run and the attribution protocol run first, untimed (their maps are what
faithfulness ranks by, as in the suite); then, timed side by side in alternating rounds
(medians), the faithfulness protocol on every counted row of the batch (quick measures, or
every measure with ``--full``: value zeroing and integrated gradients too) and one
teacher-forced pass of the batch without capture. Prints the ratio, the edited sources the
protocol ran (after de-duplication), and the load.

The machine may be shared: only the side-by-side ratio is meaningful.
"""

from __future__ import annotations

import tempfile
import time
import warnings
from pathlib import Path

import torch

from attnaudit.attribution.options import METHODS, AttributionOptions
from attnaudit.auditing.attribution_protocol import ATTRIBUTION
from attnaudit.auditing.faithfulness_protocol import FAITHFULNESS
from attnaudit.interventions.protocol import BatchContext, SuiteSettings
from attnaudit.interventions.reference_run import Reference, reference
from attnaudit.interventions.registry import registered_protocols
from attnaudit.targets.contract import Seq2SeqTarget
from attnaudit.targets.hf.loading import from_hf
from benchmarks.harness import alternating, banner, load, parser
from benchmarks.real_size import build_checkpoint, write_sources


def contexts(target: Seq2SeqTarget, limit: int, quick: bool
             ) -> list[tuple[BatchContext, Reference]]:
    """Per batch, the faithfulness protocol's context with the attribution maps filled."""
    methods = tuple(m for m in METHODS if not (quick and m == "integrated_gradients"))
    settings = SuiteSettings(quick=quick, n_examples=limit, seed=target.seed,
                             n_permutations=2, cumulative_examples=0, adversarial_examples=0,
                             attribution=AttributionOptions(), methods=methods)
    protocols = {p.name: p for p in registered_protocols()}
    out, first = [], 0
    for batch in target.iter_batches(limit):
        ref = reference(target, batch, first_example=first)
        first += len(batch)
        shared: dict = {}
        running = frozenset({ATTRIBUTION, FAITHFULNESS})
        protocols[ATTRIBUTION].run(BatchContext(target, batch, ref, ref.rows(), settings,
                                                running, {}, shared, {}))
        out.append((BatchContext(target, batch, ref, ref.rows(), settings, running, {},
                                 shared, {}), ref))
    return out


def faithfulness_time(prepared: list[tuple[BatchContext, Reference]]) -> float:
    protocol = {p.name: p for p in registered_protocols()}[FAITHFULNESS]
    start = time.perf_counter()
    for ctx, _ in prepared:
        ctx.facts = {}
        protocol.run(ctx)
    return time.perf_counter() - start


def teacher_forced_time(target: Seq2SeqTarget,
                        prepared: list[tuple[BatchContext, Reference]]) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        for _, ref in prepared:
            target.teacher_forced(ref.batch, ref.emitted)
    return time.perf_counter() - start


def measure(name: str, target: Seq2SeqTarget, limit: int, quick: bool, rounds: int) -> None:
    prepared = contexts(target, limit, quick)
    faithfulness_time(prepared)  # warm-up of both
    teacher_forced_time(target, prepared)
    faith, forced = alternating(lambda: faithfulness_time(prepared),
                                lambda: teacher_forced_time(target, prepared), rounds)
    rows = sum(len(ref.rows()) for _, ref in prepared)
    edited = sum(ctx.facts["forward_sequences"] for ctx, _ in prepared if ctx.facts)
    measures = len(prepared[0][0].facts["measures"]) if prepared[0][0].facts else 0
    print(f"{name}: {limit} examples, {rows} rows, {measures} rankings + the bound; "
          f"{edited} edited sources ({edited / limit:.0f} per example); faithfulness "
          f"{faith:.2f} s ({faith / limit:.3f} s per example), one teacher-forced pass "
          f"{forced:.4f} s ({forced / limit:.4f} s per example): ratio {faith / forced:.0f}; "
          f"{load()}")


def main() -> None:
    options = parser(__spec__.name, __doc__)
    options.add_argument("--sources", type=int, default=3, help="date BART examples")
    options.add_argument("--marian-sources", type=int, default=2, help="Marian examples")
    options.add_argument("--steps", type=int, default=8, help="Marian greedy steps")
    options.add_argument("--rounds", type=int, default=3)
    options.add_argument("--full", action="store_true", help="every measure (full mode)")
    options.add_argument("--no-marian", action="store_true", help="only the date BART")
    args = options.parse_args()
    quick = not args.full
    print(f"{banner()}; {'quick' if quick else 'full'} measures")
    from attnaudit_examples.date_transformer.target import make_target

    measure("date BART", make_target(), args.sources, quick, args.rounds)
    if args.no_marian:
        return
    with tempfile.TemporaryDirectory() as folder:
        directory, data = Path(folder) / "marian", Path(folder) / "sources.txt"
        build_checkpoint(directory)
        write_sources(data, args.marian_sources)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            target = from_hf(directory, data, batch_size=args.marian_sources,
                             max_new_tokens=args.steps, name="marian-58k")
        measure("Marian (opus-mt-en-de size)", target, args.marian_sources, quick, args.rounds)


if __name__ == "__main__":
    main()
