"""attnaudit against inseq on the date BART: gradient attributions, side by side in one run.

    pip install -e ".[bench]"   # inseq, for this script only
    python benchmarks/inseq_compare.py [--examples 100] [--ig-steps 50] [--repeats 2] [--threads 1]

Both tools start from the same source strings and do the same work: greedy generation, then
the attribution of every generated token to the source tokens, configured alike (gradient
through the attention weights, Gauss-Legendre integrated gradients with ``--ig-steps``
points from the ``<unk>`` embedding, one batch of all examples). attnaudit shares one
teacher-forced forward pass per input point between all target steps; inseq runs one Captum
call per target step. Prints each tool's time, the ratio (target: saliency >= 3x, integrated
gradients >= 2x), and the mean Spearman correlation between the two tools' per-step token
scores (L2 norm of the gradient for saliency; signed sum over the embedding for integrated
gradients), which says both computed the same thing. The machine may be shared: the runs
alternate and the best of each counts, only the side-by-side ratio is meaningful; note
``uptime`` beside any figure quoted.
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


def spearman_mean(ours: torch.Tensor, theirs: list[torch.Tensor]) -> float:
    """Mean over (example, step) of Spearman(ours[b, t, :n_b], theirs[b][:, t])."""
    values = []
    for b, other in enumerate(theirs):
        n_source, n_steps = other.shape
        for t in range(n_steps):
            rho = spearmanr(ours[b, t, :n_source].numpy(), other[:, t].numpy()).statistic
            if rho == rho:  # constant rows have none
                values.append(rho)
    return float(sum(values) / len(values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=100, help="date audit sources")
    parser.add_argument("--ig-steps", type=int, default=50, help="integration points")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs of each tool")
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
    unk = tokenizer.unk_token_id
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
                             baseline=unk, **options)
            ours_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            out = model.attribute(batch.texts, batch_size=len(batch), show_progress=False,
                                  **options)
            theirs_s.append(time.perf_counter() - start)
        reduce = ((lambda a: a.float().norm(dim=-1)) if method == "saliency"
                  else (lambda a: a.float().sum(-1)))
        theirs = [reduce(seq.source_attributions) for seq in out.sequence_attributions]
        rho = spearman_mean(ours.token_scores[method], theirs)
        ratio = min(theirs_s) / min(ours_s)
        print(f"{method:22s} attnaudit {min(ours_s):7.2f} s  inseq {min(theirs_s):7.2f} s  "
              f"(best of {args.repeats})  ratio {ratio:5.2f}x (target >= {goal}x: "
              f"{'met' if ratio >= goal else 'NOT met'})  Spearman {rho:.3f}")

if __name__ == "__main__":
    main()
