"""attnaudit against inseq on the date BART: gradient attributions, side by side in one run.

    pip install -e ".[bench]"   # inseq, for this script only
    python benchmarks/inseq_compare.py [--examples 100] [--ig-steps 50] [--repeats 2]
                                       [--check 5] [--threads 1]

Both tools start from the same source strings and do the same work: greedy generation, then
the attribution of every generated token to the source tokens, configured alike (gradient
through the attention weights, Gauss-Legendre integrated gradients with ``--ig-steps``
points from the ``<unk>`` embedding with ``</s>`` kept, one batch of all examples).
attnaudit shares one teacher-forced forward pass per input point between all target
steps; inseq runs one Captum call per target step. Prints each tool's time, the ratio
(target: saliency >= 3x, integrated gradients >= 2x), and how far apart the two tools'
per-step token scores are (L2 norm of the gradient for saliency; signed sum over the
embedding for integrated gradients) on the first ``--check`` examples, which inseq
attributes one at a time on attnaudit's outputs for this (its own generation may differ,
and its scores move with the padding of a batch): the largest absolute difference and the
mean Spearman correlation. The machine may be shared: the runs alternate and the best of
each counts, only the side-by-side ratio is meaningful; note ``uptime`` beside any figure
quoted.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import sys
import time
import warnings
from pathlib import Path

import torch
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attnaudit.interventions.attribution import attribute
from examples.date_transformer.model import MODEL_DIR
from examples.date_transformer.target import make_target

TARGETS = {"saliency": 3.0, "integrated_gradients": 2.0}


def compare(ours: torch.Tensor, theirs: list[torch.Tensor]) -> tuple[float, float, float]:
    """(largest |ours - theirs|, largest |theirs|, mean Spearman over (example, step)) of
    ours[b, t, :n_b] against theirs[b][:, t]. Spearman is noisy where a step's scores are
    all at rounding level (the end-of-sequence step, p ~ 1): the largest difference is the
    sharper check."""
    gaps, scale, rhos = [], [], []
    for b, other in enumerate(theirs):
        n_source, n_steps = other.shape
        mine = ours[b, :n_steps, :n_source].T
        gaps.append(float((mine - other).abs().max()))
        scale.append(float(other.abs().max()))
        for t in range(n_steps):
            rho = spearmanr(mine[:, t].numpy(), other[:, t].numpy()).statistic
            if rho == rho:  # constant rows have none
                rhos.append(rho)
    return max(gaps), max(scale), float(sum(rhos) / len(rhos))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=100, help="date audit sources")
    parser.add_argument("--ig-steps", type=int, default=50, help="integration points")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs of each tool")
    parser.add_argument("--check", type=int, default=5,
                        help="examples whose scores are compared (inseq one at a time)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads for both tools (1: steadier on a shared machine)")
    args = parser.parse_args()
    if importlib.util.find_spec("inseq") is None:
        print("SKIPPED: inseq is not installed; pip install -e '.[bench]' to compare")
        return
    import inseq
    from transformers import AutoTokenizer

    warnings.filterwarnings("ignore")
    target = make_target()
    batch = next(target.iter_batches(limit=args.examples))
    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), inseq "
          f"{importlib.metadata.version('inseq')}; date BART, {len(batch)} sources, IG "
          f"{args.ig_steps} points")
    for method, goal in TARGETS.items():
        options = {"n_steps": args.ig_steps} if method == "integrated_gradients" else {}
        model = inseq.load_model(target.model, method, tokenizer=tokenizer)
        ours_s, theirs_s = [], []
        for _ in range(args.repeats):  # interleaved, best of each: load spikes hit both
            start = time.perf_counter()
            emitted = target.greedy(batch)
            ours = attribute(target, batch, emitted, (method,), detach_attention=(),
                             baseline="unk", **options)
            ours_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            model.attribute(batch.texts, batch_size=len(batch), show_progress=False,
                            **options)
            theirs_s.append(time.perf_counter() - start)
        reduce = ((lambda a: a.float().norm(dim=-1)) if method == "saliency"
                  else (lambda a: a.float().sum(-1)))
        # untimed: inseq one example at a time on attnaudit's outputs (its own generation
        # may differ, and its scores move with the padding of a batch, by up to ~1e-3 here)
        outputs = tokenizer.batch_decode(emitted[: args.check], skip_special_tokens=True)
        alone = model.attribute(batch.texts[: args.check], outputs, batch_size=1,
                                show_progress=False, **options)
        theirs = [reduce(seq.source_attributions) for seq in alone.sequence_attributions]
        gap, scale, rho = compare(ours.token_scores[method][: args.check], theirs)
        ratio = min(theirs_s) / min(ours_s)
        print(f"{method:22s} attnaudit {min(ours_s):7.2f} s  inseq {min(theirs_s):7.2f} s  "
              f"(best of {args.repeats})  ratio {ratio:5.2f}x (target >= {goal}x: "
              f"{'met' if ratio >= goal else 'NOT met'}); scores: max |difference| "
              f"{gap:.1e} (largest {scale:.1e}), mean Spearman {rho:.3f}")

if __name__ == "__main__":
    main()
