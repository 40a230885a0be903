"""attnaudit against inseq on the date BART: gradient attributions, side by side in one run.

    pip install -e ".[bench]"   # inseq, for this script only
    python -m benchmarks.inseq_compare [--examples 100] [--ig-steps 50] [--repeats 2]
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
each counts, only the side-by-side ratio is meaningful; the ``uptime`` load averages are
printed beside the figures.

It also prints two floors for an exact method that back-propagates each step's output (the
gradient at the source of each of the ``T`` steps is a separate vector-Jacobian product
through the encoder), measured in the same run on the same batch. Both count greedy
generation and one forward pass per input point; per input point and step, the first adds
one backward pass through the encoder alone (the decoder's backward free), the second also
the decoder's backward over the step's own prefix only (positions ``0..t``, as if it cost
nothing to leave out the later positions of a shared pass). inseq's time over a floor is the
largest ratio such a method can reach here.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import time
import warnings

import torch
from scipy.stats import spearmanr

from attnaudit.attribution.methods import attribute
from attnaudit.targets.contract import Batch
from attnaudit_examples.date_transformer.model import MODEL_DIR
from attnaudit_examples.date_transformer.target import make_target
from benchmarks.harness import best_of, load, parser

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


def pass_costs(model: torch.nn.Module, batch: Batch, emitted: torch.Tensor) -> dict[str, float]:
    """Seconds for the batch's greedy generation (``greedy``), one teacher-forced forward
    pass with gradients (``forward``: encoder and decoder), one backward pass through the
    encoder alone from a step's gradient at its output (``encoder_backward``), and the
    decoder's backward passes from each step ``t`` to the encoder's output through a decoder
    run over positions ``0..t`` only (``prefix_backward``, their sum over the steps)."""
    mask = batch.source_mask.long()
    start = torch.full_like(emitted[:, :1], model.config.decoder_start_token_id)
    decoder_ids = torch.cat([start, emitted[:, :-1]], 1)
    embedded = model.get_encoder().get_input_embeddings()(batch.source_ids)
    embedded = embedded.detach().requires_grad_()

    def encode() -> torch.Tensor:
        return model.get_encoder()(inputs_embeds=embedded, attention_mask=mask)[0]

    def decode(states: torch.Tensor, width: int) -> torch.Tensor:
        return model(encoder_outputs=(states,), attention_mask=mask,
                     decoder_input_ids=decoder_ids[:, :width]).logits

    with torch.enable_grad():
        states = encode()
        held = states.detach().requires_grad_()
        logits = decode(held, decoder_ids.shape[1])
        at_states = torch.autograd.grad(logits[:, 0].logsumexp(-1).sum(), held)[0]
        prefix = []
        for step in range(decoder_ids.shape[1]):
            out = decode(held, step + 1)[:, step].logsumexp(-1).sum()
            prefix.append(best_of(lambda out=out: torch.autograd.grad(out, held,
                                                                      retain_graph=True)))
        return {
            "greedy": best_of(lambda: model.generate(
                input_ids=batch.source_ids, attention_mask=mask, do_sample=False,
                num_beams=1, max_new_tokens=emitted.shape[1])),
            "forward": best_of(lambda: decode(encode(), decoder_ids.shape[1])),
            "encoder_backward": best_of(lambda: torch.autograd.grad(
                states, embedded, at_states, retain_graph=True)),
            "prefix_backward": sum(prefix),
        }


def floors(costs: dict[str, float], steps: int, points: int) -> tuple[float, float]:
    """Seconds no exact per-step method can beat (module docstring): with the decoder's
    backward free, and with it over each step's prefix only. Integrated gradients adds the
    forward passes at the input and at the baseline."""
    extra = 2 if points > 1 else 0
    encoder_only = (costs["greedy"] + (points + extra) * costs["forward"]
                    + points * steps * costs["encoder_backward"])
    return encoder_only, encoder_only + points * costs["prefix_backward"]


def main() -> None:
    options = parser(__spec__.name, __doc__)
    options.add_argument("--examples", type=int, default=100, help="date audit sources")
    options.add_argument("--ig-steps", type=int, default=50, help="integration points")
    options.add_argument("--repeats", type=int, default=2, help="timed runs of each tool")
    options.add_argument("--check", type=int, default=5,
                         help="examples whose scores are compared (inseq one at a time)")
    options.add_argument("--threads", type=int, default=1,
                         help="torch threads for both tools (1: steadier on a shared machine)")
    args = options.parse_args()
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
          f"{importlib.metadata.version('inseq')}, {load()}; date BART, {len(batch)} "
          f"sources, IG {args.ig_steps} points")
    emitted = target.greedy(batch)
    costs = pass_costs(target.model, batch, emitted)
    n_steps = emitted.shape[1]
    print(f"one batch, {n_steps} steps: greedy {costs['greedy']:.3f} s, teacher-forced "
          f"forward {costs['forward']:.3f} s, encoder backward {costs['encoder_backward']:.3f} "
          f"s per step, decoder backward over each step's prefix {costs['prefix_backward']:.3f} "
          "s for all steps")
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
        encoder_only, truncated = floors(costs, n_steps, options.get("n_steps", 1))
        print(f"{method:22s} attnaudit {min(ours_s):7.2f} s  inseq {min(theirs_s):7.2f} s  "
              f"(best of {args.repeats})  ratio {ratio:5.2f}x (target >= {goal}x: "
              f"{'met' if ratio >= goal else 'NOT met'}); floors {encoder_only:.2f} s / "
              f"{truncated:.2f} s: at most {min(theirs_s) / encoder_only:.2f}x / "
              f"{min(theirs_s) / truncated:.2f}x; scores: max |difference| {gap:.1e} (largest "
              f"{scale:.1e}), mean Spearman {rho:.3f}")
    print(f"{load()} at the end")


if __name__ == "__main__":
    main()
