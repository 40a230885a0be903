"""Long prompts: ``attnaudit check`` beside the model's own work, time and peak memory, from
512 to 8k tokens.

    python -m benchmarks.long_context [--lengths 512,1024,2048,4096,8192] [--layers 8]
        [--heads 16] [--width 512] [--batch 2] [--new-tokens 16] [--max-memory 1GiB]
        [--no-seq2seq] [--rounds 3] [--cpu-time]

A decoder-only Llama-architecture model built from a config (``--layers`` x ``--heads``,
``--width``, vocabulary 1,000, seeded random weights) with a word-level tokenizer built
locally (nothing is downloaded) continues ``--batch`` prompts of exactly N tokens greedily
for ``--new-tokens`` tokens. For each length N, two child processes, each started fresh:
the model's own work (greedy decoding + one teacher-forced pass of its output) and
``check`` on the same target (``attnaudit.audit(..., checks_only=True,
max_memory=...)``, what ``attnaudit check --max-memory`` runs). Each prints the seconds
of that work; the parent reads each child's peak RSS. Printed per length: both times and
peaks, the ratios check / own, and whether check's peak stays within the model's own peak
plus the memory budget. Then, unless ``--no-seq2seq``, the bundled date BART and the
Marian model of :mod:`benchmarks.real_size` (opus-mt-en-de's size) through the same check,
timed beside their own work in one process (:func:`benchmarks.harness.alternating`, medians
of ``--rounds`` rounds; more rounds steady the ratio on a busy machine). ``--cpu-time``
times that comparison in this process's CPU seconds rather than wall seconds: with one
torch thread, what other processes on a shared machine take then counts for neither side.

The machine may be shared: the load is printed at the start and end; only ratios measured
in one run are meaningful.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

import attnaudit
from attnaudit.capturing.blocks import parse_memory
from benchmarks import real_size
from benchmarks.harness import alternating, banner, load, parser, python_module, run_child
from benchmarks.real_size import check_work, own_work

VOCAB = 1000
SEED = 0


def build(args: argparse.Namespace, length: int):
    """The seeded Llama target over ``args.batch`` prompts of ``length`` tokens."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from attnaudit.targets.hf.loading import from_hf

    torch.manual_seed(SEED)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=args.width,
                         intermediate_size=4 * args.width, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, num_key_value_heads=args.heads,
                         max_position_embeddings=length + args.new_tokens + 8,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0,
                         attn_implementation="sdpa")
    model = LlamaForCausalLM(config).eval()
    words = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{f"w{i}": i for i in range(4, VOCAB)}}
    core = Tokenizer(WordLevel(words, unk_token="<unk>"))
    core.pre_tokenizer = WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>",
                                        pad_token="<pad>", eos_token="</s>", bos_token="<s>")
    gen = torch.Generator().manual_seed(SEED + 1)
    prompts = [" ".join(f"w{i}" for i in torch.randint(4, VOCAB, (length,), generator=gen))
               for _ in range(args.batch)]
    return from_hf(model, prompts, tokenizer=tokenizer, batch_size=args.batch,
                   max_new_tokens=args.new_tokens, max_source_tokens=length,
                   name=f"llama-{length}")


def child(args: argparse.Namespace) -> None:
    attnaudit.audit  # noqa: B018 -- its imports (captum, scipy...) load outside the timing
    target = build(args, args.length)
    tokens = next(target.iter_batches()).source_mask.sum(1).tolist()
    assert tokens == [args.length] * args.batch, tokens
    seconds = (own_work(target) if args.child == "own"
               else check_work(target, max_memory=parse_memory(args.max_memory)))
    print(f"{seconds:.3f}")


def measure(args: argparse.Namespace, length: int, which: str) -> tuple[float, float]:
    """(seconds of the work, peak RSS in GiB) of a fresh child doing ``which`` at ``length``."""
    run = run_child(python_module(
        __spec__.name, "--child", which, "--length", str(length), "--layers",
        str(args.layers), "--heads", str(args.heads), "--width", str(args.width), "--batch",
        str(args.batch), "--new-tokens", str(args.new_tokens), "--max-memory",
        args.max_memory))
    return float(run.stdout.split()[-1]), run.peak_rss_gib


def causal_lengths(args: argparse.Namespace) -> None:
    budget = parse_memory(args.max_memory) / 2**30
    print(f"Llama {args.layers} layers x {args.heads} heads, width {args.width}, vocabulary "
          f"{VOCAB:,}; batch {args.batch}, {args.new_tokens} new tokens; check's memory "
          f"budget {budget:.2f} GiB")
    print(f"{'tokens':>7} {'own s':>8} {'check s':>8} {'time x':>7} {'own GiB':>8} "
          f"{'check GiB':>9} {'RSS x':>6} {'<= own + budget':>15}  load")
    for length in args.lengths:
        own_s, own_gib = measure(args, length, "own")
        check_s, check_gib = measure(args, length, "check")
        within = "yes" if check_gib <= own_gib + budget else "NO"
        print(f"{length:>7} {own_s:>8.2f} {check_s:>8.2f} {check_s / own_s:>7.2f} "
              f"{own_gib:>8.2f} {check_gib:>9.2f} {check_gib / own_gib:>6.2f} {within:>15}  "
              f"{load()}", flush=True)


def seq2seq(args: argparse.Namespace) -> None:
    """The date BART and the opus-mt-sized Marian through the same check."""
    from attnaudit_examples.date_transformer.target import make_target

    max_memory = parse_memory(args.max_memory)
    clock = time.process_time if args.cpu_time else time.perf_counter
    unit = "CPU s" if args.cpu_time else "s"
    date = make_target()
    own_work(date)  # warm-up
    own, gate = alternating(lambda: own_work(date, clock=clock),
                            lambda: check_work(date, max_memory=max_memory, clock=clock),
                            args.rounds)
    print(f"date BART ({date.name}): own {own:.2f} {unit}, check {gate:.2f} {unit}, ratio "
          f"{gate / own:.2f} (target <= 1.2)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        directory, data = Path(tmp) / "marian", Path(tmp) / "sources.txt"
        real_size.build_checkpoint(directory)
        real_size.write_sources(data, 16)
        options = argparse.Namespace(batch_size=8, steps=16)
        marian = real_size.load_marian(directory, data, options)
        own_work(marian, 8)  # warm-up
        own, gate = alternating(lambda: own_work(marian, 16, clock),
                                lambda: check_work(marian, 16, max_memory, clock),
                                args.rounds)
        print(f"Marian (opus-mt-en-de size, 16 sources, 16 steps): own {own:.2f} {unit}, "
              f"check {gate:.2f} {unit}, ratio {gate / own:.2f} (target <= 1.2)")


def main() -> None:
    options = parser(__spec__.name, __doc__)
    options.add_argument("--lengths", type=lambda s: [int(n) for n in s.split(",")],
                         default=[512, 1024, 2048, 4096, 8192],
                         help="prompt lengths in tokens, comma-separated")
    options.add_argument("--layers", type=int, default=8)
    options.add_argument("--heads", type=int, default=16)
    options.add_argument("--width", type=int, default=512)
    options.add_argument("--batch", type=int, default=2)
    options.add_argument("--new-tokens", type=int, default=16)
    options.add_argument("--max-memory", default="1GiB", help="check's memory budget")
    options.add_argument("--no-seq2seq", action="store_true",
                         help="skip the date BART and Marian comparison")
    options.add_argument("--rounds", type=int, default=3,
                         help="timing rounds of the seq2seq comparison, alternating which "
                              "runs first")
    options.add_argument("--cpu-time", action="store_true",
                         help="time the seq2seq comparison in this process's CPU seconds")
    options.add_argument("--child", choices=["own", "check"], help=argparse.SUPPRESS)
    options.add_argument("--length", type=int, help=argparse.SUPPRESS)
    args = options.parse_args()
    if args.child is not None:
        child(args)
        return
    print(banner())
    causal_lengths(args)
    if not args.no_seq2seq:
        seq2seq(args)
    print(f"{load()} at the end")


if __name__ == "__main__":
    main()
