"""A model at real size: opus-mt-en-de's dimensions, audited as a user would, in one run.

    python -m benchmarks.real_size [--sources 16] [--batch-size 8] [--steps 16]
                                   [--rounds 3] [--cumulative-examples 50]
                                   [--only check,validity,permutation,suite]

Builds a Marian model with the dimensions of Helsinki-NLP/opus-mt-en-de (6 + 6 layers,
d_model 512, 8 heads, FFN 2048, vocabulary 58,101, about 74 M parameters) from a config
with random weights, and a word-level tokenizer over the same vocabulary size, built
locally; nothing is downloaded. Saved to a temporary directory and loaded with
``attnaudit.from_hf`` like any checkpoint. Sources are seeded random word sequences;
greedy decoding runs ``--steps`` steps (a random model rarely emits end-of-sequence).

Prints, measured side by side in this run (medians of ``--rounds`` rounds that alternate
which of a compared pair runs first):

1. the model's own work on the N sources: greedy decoding + one teacher-forced pass;
2. ``attnaudit check``'s time (``attnaudit.audit(..., checks_only=True)``, what it runs)
   as a ratio of it (target <= 1.2); ``--cpu-time`` times both in this process's CPU
   seconds (the busier the machine, the more its wall-clock ratio moves between runs);
3. the permutation test (20 permutations per row, the ``--quick`` count): time per edited
   item as a ratio of one KV-cached decoder step per sequence, timed on the same chunk
   shape without capture (target <= 2); the same ratio for the date LSTM;
4. the validity audit (what ``attnaudit report`` runs before its suite) with the
   comparison of the model's own cached decoding against the teacher-forced pass, as a
   ratio of it without;
5. peak RSS of the whole ``--quick`` suite (``run_suite``) at N and at 4N sources, each in
   a fresh process (targets: <= 4 GB, ratio <= 1.2). On a small machine
   ``--cumulative-examples`` shortens the run (the cumulative removal test is the longest
   part; memory does not depend on it).

``--only`` runs only the named parts, comma-separated (``check``: 1 and 2; ``validity``: 4;
``permutation``: 3; ``suite``: 5), e.g. ``--only check,permutation`` for the two ratios with
targets in a few minutes.

The machine may be shared: only the side-by-side ratios are meaningful.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

import attnaudit
from attnaudit.auditing.intervention_suite import CUMULATIVE_EXAMPLES, QUICK_PERMUTATIONS, run_suite
from attnaudit.interventions.permutation import permutation_test
from attnaudit.interventions.reference_run import Reference, RowIndex, reference
from attnaudit.targets.contract import Seq2SeqTarget, select_state
from attnaudit.targets.hf.loading import from_hf
from attnaudit.validity.pipeline import run_validity_audit
from benchmarks.harness import alternating, banner, load, parser, python_module, run_child

VOCAB = 58_101
SPECIALS = ["</s>", "<unk>", "<pad>"]  # ids 0, 1, 2 as in opus-mt (pad is the start token)
SEED = 2024
PARTS = ("check", "validity", "permutation", "suite")
Clock = Callable[[], float]


def build_checkpoint(directory: Path) -> None:
    """An opus-mt-en-de-sized Marian with random weights and a word-level tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import MarianConfig, MarianMTModel, PreTrainedTokenizerFast

    words = SPECIALS + [f"w{i}" for i in range(VOCAB - len(SPECIALS))]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.post_processor = processors.TemplateProcessing(single="$A </s>",
                                                        special_tokens=[("</s>", 0)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="</s>",
                                        unk_token="<unk>", pad_token="<pad>")
    config = MarianConfig(vocab_size=VOCAB, decoder_vocab_size=VOCAB, d_model=512,
                          encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                          decoder_attention_heads=8, encoder_ffn_dim=2048,
                          decoder_ffn_dim=2048, max_position_embeddings=512,
                          pad_token_id=2, eos_token_id=0, decoder_start_token_id=2,
                          forced_eos_token_id=0, scale_embedding=True,
                          share_encoder_decoder_embeddings=True)
    torch.manual_seed(SEED)
    MarianMTModel(config).eval().save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def write_sources(path: Path, count: int) -> None:
    """``count`` seeded random word sequences, 8 to 20 words each."""
    rng = random.Random(SEED)
    lines = [" ".join(f"w{rng.randrange(VOCAB - len(SPECIALS))}"
                      for _ in range(rng.randint(8, 20))) for _ in range(count)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def load_marian(directory: Path, data: Path, args: argparse.Namespace) -> Seq2SeqTarget:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return from_hf(directory, data, batch_size=args.batch_size,
                       max_new_tokens=args.steps, name="marian-58k")


def own_work(target: Seq2SeqTarget, limit: int | None = None,
             clock: Clock = time.perf_counter) -> float:
    """Seconds (of ``clock``) of greedy decoding and one teacher-forced pass over the data,
    no capture."""
    start = clock()
    with torch.no_grad():
        for batch in target.iter_batches(limit):
            target.teacher_forced(batch, target.greedy(batch))
    return clock() - start


def check_work(target: Seq2SeqTarget, limit: int | None = None, max_memory: int | None = None,
               clock: Clock = time.perf_counter) -> float:
    """Seconds (of ``clock``) of what ``attnaudit check`` runs on the target."""
    start = clock()
    attnaudit.audit(target, limit=limit, progress=False, checks_only=True,
                    max_memory=max_memory)
    return clock() - start


def validity_time(target: Seq2SeqTarget, limit: int) -> float:
    """Seconds of the validity audit (``attnaudit report``'s, without the suite)."""
    start = time.perf_counter()
    run_validity_audit(target, limit=limit, progress=False)
    return time.perf_counter() - start


def per_item_ratio(target: Seq2SeqTarget, limit: int) -> tuple[float, float, int]:
    """(seconds per permutation item, seconds per cached decoder step per sequence, items).

    Step by step, the permutation test on that step's rows and, beside it (which runs first
    alternates), the same number of sequences' cached decoder step without capture: the
    shape of the permutation test's chunk, from the reference's cached state."""
    assert target.decode_step is not None
    permuting = stepping = 0.0
    items = 0
    first = 0
    for batch in target.iter_batches(limit):
        ref = reference(target, batch, first_example=first)
        first += len(batch)
        rows = ref.rows()
        for turn, step in enumerate(torch.unique(rows.step).tolist()):
            at_step = rows.select((rows.step == step).nonzero().squeeze(1))
            example = at_step.example.repeat_interleave(QUICK_PERMUTATIONS)

            def permute(at_step: RowIndex = at_step, ref: Reference = ref) -> float:
                start = time.perf_counter()
                permutation_test(target, ref, at_step, n_permutations=QUICK_PERMUTATIONS)
                return time.perf_counter() - start

            def one_step(example: torch.Tensor = example, ref: Reference = ref,
                         step: int = step) -> float:
                start = time.perf_counter()
                with torch.no_grad():
                    target.decode_step(ref.batch.select(example),
                                       select_state(ref.encoded, example),
                                       select_state(ref.states, example),
                                       ref.emitted[example], step)
                return time.perf_counter() - start

            if turn % 2:
                stepping += one_step()
                permuting += permute()
            else:
                permuting += permute()
                stepping += one_step()
            items += len(example)
    return permuting / items, stepping / items, items


def suite_peak_rss(directory: Path, data: Path, sources: int, args: argparse.Namespace
                   ) -> float:
    """Peak RSS in GiB of a fresh process running the --quick suite on ``sources``."""
    command = python_module(__spec__.name, "--suite-child", str(sources), "--checkpoint",
                            str(directory), "--data", str(data), "--batch-size",
                            str(args.batch_size), "--steps", str(args.steps),
                            "--cumulative-examples", str(args.cumulative_examples))
    return run_child(command).peak_rss_gib


def suite_child(args: argparse.Namespace) -> None:
    target = load_marian(Path(args.checkpoint), Path(args.data), args)
    run_suite(target, quick=True, limit=args.suite_child, progress=False,
              cumulative_examples=args.cumulative_examples)


def parts(text: str) -> tuple[str, ...]:
    """``--only``'s value: the named parts, each one of :data:`PARTS`."""
    named = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = sorted(set(named) - set(PARTS))
    if unknown or not named:
        raise argparse.ArgumentTypeError(f"parts are {', '.join(PARTS)}; got {text!r}")
    return named


def main() -> None:
    options = parser(__spec__.name, __doc__)
    options.add_argument("--sources", type=int, default=16, help="N (the suite also runs 4N)")
    options.add_argument("--batch-size", type=int, default=8)
    options.add_argument("--steps", type=int, default=16, help="greedy decoding steps")
    options.add_argument("--rounds", type=int, default=3,
                         help="timing rounds, alternating which of a pair runs first")
    options.add_argument("--cumulative-examples", type=int, default=CUMULATIVE_EXAMPLES,
                         help="examples the suite's cumulative removal test covers (default "
                              "%(default)s, the suite's own; fewer keeps the run short)")
    options.add_argument("--only", type=parts, default=PARTS,
                         help="comma-separated parts to run, of " + ",".join(PARTS)
                              + " (default: all)")
    options.add_argument("--cpu-time", action="store_true",
                         help="time the check and the model's own work in this process's CPU "
                              "seconds (every thread), which other jobs on a shared machine "
                              "do not inflate")
    options.add_argument("--suite-child", type=int, help=argparse.SUPPRESS)
    options.add_argument("--checkpoint", help=argparse.SUPPRESS)
    options.add_argument("--data", help=argparse.SUPPRESS)
    args = options.parse_args()
    if args.suite_child is not None:
        suite_child(args)
        return
    n = args.sources
    with tempfile.TemporaryDirectory() as tmp:
        directory, data = Path(tmp) / "marian", Path(tmp) / "sources.txt"
        build_checkpoint(directory)
        write_sources(data, 4 * n)
        target = load_marian(directory, data, args)
        params = sum(p.numel() for p in target.model.parameters()) / 1e6
        print(f"{banner()}; Marian {params:.1f} M parameters, vocabulary {VOCAB:,}; "
              f"N = {n} sources, batch {args.batch_size}, {args.steps} steps")
        own_work(target, args.batch_size)  # warm-up
        if "check" in args.only:
            clock, unit = ((time.process_time, "CPU s") if args.cpu_time
                           else (time.perf_counter, "s"))
            own, gate = alternating(lambda: own_work(target, n, clock),
                                    lambda: check_work(target, n, clock=clock), args.rounds)
            print(f"model's own work (greedy + teacher-forced): {own:.2f} {unit}")
            print(f"check: {gate:.2f} {unit}, ratio {gate / own:.2f} (target <= 1.2)")
        if "validity" in args.only:
            without, with_cached = alternating(
                lambda: validity_time(target.with_options(cached_decode=None), n),
                lambda: validity_time(target, n), args.rounds)
            print(f"validity audit: {without:.2f} s without the cached-decoding comparison, "
                  f"{with_cached:.2f} s with it; ratio {with_cached / without:.2f}")
        if "permutation" in args.only:
            per_item, per_step, items = per_item_ratio(target, n)
            print(f"permutation test: {items} edited items, {per_item * 1e3:.2f} ms per item; "
                  f"one cached decoder step {per_step * 1e3:.2f} ms per sequence; ratio "
                  f"{per_item / per_step:.2f} (target <= 2)")
            from attnaudit_examples.date.target import make_target

            date = make_target(limit=n)
            per_item, per_step, items = per_item_ratio(date, n)
            print(f"date LSTM: {items} edited items, {per_item * 1e3:.3f} ms per item; one "
                  f"cached step {per_step * 1e3:.3f} ms per sequence; ratio "
                  f"{per_item / per_step:.2f}")
        if "suite" in args.only:
            at_n = suite_peak_rss(directory, data, n, args)
            at_4n = suite_peak_rss(directory, data, 4 * n, args)
            print(f"--quick suite peak RSS: {at_n:.2f} GiB at N = {n}, {at_4n:.2f} GiB at 4N = "
                  f"{4 * n}; ratio {at_4n / at_n:.2f} (targets <= 4 GB, <= 1.2)")
        print(f"{load()} at the end")


if __name__ == "__main__":
    main()
