"""Decoder-only attribution at a real vocabulary size: time and peak memory of the quick
intervention suite with every attribution option, at N and 4N prompts, in one run.

    python -m benchmarks.causal_attribution [--prompts 8] [--new-tokens 8]

A GPT-2 built from a config (6 layers, width 512, vocabulary 50,257, seeded random weights,
nothing downloaded) continues seeded word-level prompts of 8 to 30 words greedily, in
batches of 8. Each run is a fresh process running ``run_suite(..., quick=True)`` with
contrastive attribution (a seeded 4-word contrast continuation per prompt), target-side
scores and the methods saliency, input x gradient, integrated gradients, DeepLift and
GradientShap. Prints each run's time and peak resident memory, and the memory ratio of 4N
to N prompts (target <= 1.2: memory does not grow with the number of examples). The
machine may be shared: the ``uptime`` load averages are printed beside the figures.
"""

from __future__ import annotations

import argparse

from benchmarks.harness import load, parser, python_module, run_child

METHODS = ("saliency", "input_x_gradient", "integrated_gradients", "deeplift", "gradient_shap")
BATCH = 8


def child(prompts: int, new_tokens: int) -> None:
    """Build the target and run the suite (in this fresh process)."""
    from attnaudit.attribution.options import AttributionOptions
    from attnaudit.auditing.intervention_suite import run_suite
    from benchmarks.causal_lm import build  # transformers, in the child only

    target = build(prompts, 30, new_tokens, vocab=50257, width=512, layers=6,
                   batch_size=BATCH, contrast_words=4)
    options = AttributionOptions("contrast", target_side=True, methods=METHODS)
    suite = run_suite(target, quick=True, progress=False, attribution=options)
    print(f"rows {len(suite.tables['rows'])}")


def main() -> None:
    options = parser(__spec__.name, __doc__)
    options.add_argument("--prompts", type=int, default=8)
    options.add_argument("--new-tokens", type=int, default=8)
    options.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = options.parse_args()
    if args.child:
        child(args.child, args.new_tokens)
        return
    print(load())
    peaks = {}
    for prompts in (args.prompts, 4 * args.prompts):
        done = run_child(python_module(__spec__.name, "--child", str(prompts),
                                       "--new-tokens", str(args.new_tokens)))
        peaks[prompts] = done.peak_rss_gib
        print(f"{prompts:4d} prompts ({done.stdout.strip()}): {done.seconds:7.1f} s, peak RSS "
              f"{peaks[prompts]:.2f} GiB")
    ratio = peaks[4 * args.prompts] / peaks[args.prompts]
    print(f"peak RSS at {4 * args.prompts} / {args.prompts} prompts: {ratio:.2f} "
          f"(target <= 1.2: {'met' if ratio <= 1.2 else 'NOT met'}); {load()}")


if __name__ == "__main__":
    main()
