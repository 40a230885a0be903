"""Intervention speed: permutations folded into the batch vs one forward per permutation,
and the whole date intervention suite, measured in one run.

    python -m benchmarks.intervention_speed [--examples 400] [--sample 8] [--no-suite]

1. The permutation test (100 permutations) on the date model's audit examples, batched
   (rows x permutations folded into chunks of forward passes), against two unbatched
   loops: one forward pass per permutation of one row (an (example, step) pair, edited at
   its step: the per-row protocol run naively), and one forward pass per (example,
   permutation) that holds one copy of the example per step, each edited at its own step. The
   loops are timed on ``--sample`` examples and scaled to all examples (they are linear in
   them); the batched run covers all examples.
2. The whole suite (``run_suite``, integrated gradients and the adversarial subset
   included) on the same examples; target <= 180 s on 2 cores.

Prints times and ratios (target speed-up >= 10x). The machine may be shared, so only the
side-by-side ratio is meaningful.
"""

from __future__ import annotations

import time

import torch

from attnaudit.auditing.intervention_suite import run_suite
from attnaudit.interventions.permutation import _PermutationEdit, permutation_test
from attnaudit.interventions.reference_run import reference
from attnaudit.interventions.runner import edited_probs
from attnaudit_examples.date.target import make_target
from benchmarks.harness import banner, load, parser

PERMUTATIONS = 100


def batched(target, refs) -> float:
    start = time.perf_counter()
    for ref in refs:
        permutation_test(target, ref, n_permutations=PERMUTATIONS)
    return time.perf_counter() - start


def one_forward_per_permutation(target, ref, examples: list[int], *, per_row: bool) -> float:
    """An unbatched loop on ``examples`` (local indices of ``ref``): one forward pass per
    permutation of each row (``per_row``) or of each example (one copy per step, folded)."""
    rows = ref.rows()
    edit = _PermutationEdit(ref, rows, PERMUTATIONS)
    start = time.perf_counter()
    with torch.no_grad():
        for ex in examples:
            mine = (rows.example == ex).nonzero().squeeze(1)
            groups = [mine[i : i + 1] for i in range(len(mine))] if per_row else [mine]
            for group in groups:
                for r in range(PERMUTATIONS):
                    edited_probs(target, ref, rows.example[group], rows.step[group], edit,
                                 group * PERMUTATIONS + r)
    return time.perf_counter() - start


def main() -> None:
    options = parser(__spec__.name, __doc__)
    options.add_argument("--examples", type=int, default=400,
                         help="date audit sources the batched run and the suite cover")
    options.add_argument("--sample", type=int, default=8,
                         help="examples the unbatched loops are timed on (from the first "
                              "batch)")
    options.add_argument("--no-suite", action="store_true", help="skip the whole-suite timing")
    args = options.parse_args()
    target = make_target(limit=args.examples)
    refs, first = [], 0
    for batch in target.iter_batches():
        refs.append(reference(target, batch, first_example=first))
        first += len(batch)
    if not 0 < args.sample <= len(refs[0].batch):
        options.error(f"--sample must be between 1 and {len(refs[0].batch)} (the first batch)")
    n_rows = sum(len(r.rows()) for r in refs)
    print(f"{banner()}; {first} examples, {n_rows} rows, {PERMUTATIONS} permutations")
    sample = list(range(args.sample))
    per_row = one_forward_per_permutation(target, refs[0], sample, per_row=True)
    per_example = one_forward_per_permutation(target, refs[0], sample, per_row=False)
    fold = batched(target, refs)
    scale = first / args.sample
    print(f"one forward per permutation of a row:         {per_row:.2f} s on {args.sample} "
          f"examples -> {per_row * scale:.1f} s scaled to {first}")
    print(f"one forward per (example, permutation):       {per_example:.2f} s on "
          f"{args.sample} examples -> {per_example * scale:.1f} s scaled to {first}")
    print(f"batched (folded):                             {fold:.1f} s")
    print(f"speed-up vs one forward per row permutation:  {per_row * scale / fold:.1f}x "
          "(target >= 10x)")
    print(f"speed-up vs one forward per example permutation (steps folded): "
          f"{per_example * scale / fold:.1f}x")
    if not args.no_suite:
        start = time.perf_counter()
        suite = run_suite(target, progress=False)
        wall = time.perf_counter() - start
        print(f"whole suite (IG and adversarial subset included): {wall:.1f} s for "
              f"{suite.metadata['examples']} examples (target <= 180 s)")
    print(f"{load()} at the end")


if __name__ == "__main__":
    main()
