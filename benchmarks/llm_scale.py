"""A Llama-3.2-1B-shaped decoder-only model in bfloat16: the model's own work, ``check`` and
the quick audit, each in a fresh process, with time, peak memory and the ratios.

    python -m benchmarks.llm_scale [--layers 16] [--hidden 2048] [--heads 32] [--kv-heads 8]
        [--mlp 8192] [--vocab 128256] [--check-tokens 512] [--quick-tokens 96]
        [--new-tokens 6] [--device cpu|cuda] [--dtype bfloat16] [--rounds 1] [--full]

The model is built from a ``LlamaConfig`` of the given sizes (defaults: Llama-3.2-1B's, tied
embeddings, 1.24B parameters; seeded random weights, nothing downloaded) and saved with a
word-level tokenizer of the same vocabulary (built with ``tokenizers``). Two seeded prompts
of ``--check-tokens`` / ``--quick-tokens`` words decode ``--new-tokens`` greedily. Five
measurements, each a fresh process that loads the saved folder: the model's own work
(``generate`` plus one teacher-forced pass over prompt and output) at each prompt length,
``attnaudit.audit(..., checks_only=True)`` at the check length, ``audit(..., quick=True)``
at the quick one, and the full audit's plan at the quick length (the one ``audit()`` prints
before it runs, without a pilot: its estimate, not a run). Printed per measurement: the
timed section's seconds (loading excluded) and its CPU seconds (every thread of the
process: less moved by other processes on a shared machine), the process's peak RSS, CUDA's
peak allocation on a GPU, the load before and after, for the quick audit each protocol's
time (its progress line's last words) and the estimate of the plan it printed first against
what the audit took after the plan was made (the estimate is of what is left), and
for the full audit's plan its table; then ``check``, the quick audit and the full audit's
planned time as multiples of the model's own work at the same length (wall and CPU time).
With ``--rounds N`` the model's own work and the quick audit at the quick length run N times,
alternating, and the quick audit's ratio is each round's (to the model's own run just before
it) and their median: the shared machine's other load moves single runs by about 20 %.
With ``--full`` the full audit itself runs last, at the quick length with its progress
display: its time per protocol, its plan against what it took, and its ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import banner, load, parser, python_module, run_child

SIZES = {"layers": 16, "hidden": 2048, "heads": 32, "kv_heads": 8, "mlp": 8192,
         "vocab": 128256}
SPECIAL = ("<pad>", "<s>", "</s>", "<unk>")  # ids 0-3
# the ratios' names (the plan's seconds are its estimate of the full audit, not a run)
LABELS = {"check": "check", "quick": "quick audit", "plan": "full audit's planned time",
          "full": "full audit"}


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__spec__.name if __spec__ else "benchmarks.llm_scale", __doc__)
    for name, default in SIZES.items():
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    p.add_argument("--check-tokens", type=int, default=512)
    p.add_argument("--quick-tokens", type=int, default=96)
    p.add_argument("--new-tokens", type=int, default=6)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    p.add_argument("--rounds", type=int, default=1,
                   help="alternating runs of the model's own work and the quick audit")
    p.add_argument("--full", action="store_true",
                   help="also run the full audit after its plan, and compare the two")
    p.add_argument("--child", choices=["build", "model", "check", "quick", "plan", "full"],
                   help=argparse.SUPPRESS)
    p.add_argument("--folder", help=argparse.SUPPRESS)
    p.add_argument("--prompt-tokens", type=int, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def build(folder: Path, args: argparse.Namespace) -> int:
    """Save the seeded model and its word-level tokenizer into ``folder``; its parameters."""
    import torch
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.mlp,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, tie_word_embeddings=True,
        max_position_embeddings=max(args.check_tokens, args.quick_tokens) + args.new_tokens + 8,
        bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = LlamaForCausalLM(config).to(getattr(torch, args.dtype)).eval()
    model.generation_config.do_sample = False
    model.save_pretrained(folder)
    words = {w: i for i, w in enumerate(SPECIAL)}
    words.update({f"w{i}": i for i in range(len(SPECIAL), args.vocab)})
    tok = Tokenizer(WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>",
                            eos_token="</s>", bos_token="<s>").save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def prompts(vocab: int, tokens: int) -> list[str]:
    """Two seeded prompts of ``tokens`` words (ordinary ids only)."""
    import torch

    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(len(SPECIAL), vocab, (2, tokens), generator=gen)
    return [" ".join(f"w{int(i)}" for i in row) for row in ids]


def child(args: argparse.Namespace) -> None:
    """One measurement in this process; prints a JSON line with the timed seconds."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import attnaudit
    from attnaudit.auditing.plan import plan_audit
    from attnaudit.options import AuditOptions
    from attnaudit.targets.checks import checked_target

    folder = Path(args.folder)
    device = torch.device(args.device)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, args.dtype))
    model = model.to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    texts = prompts(args.vocab, args.prompt_tokens)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start, cpu_start = time.perf_counter(), time.process_time()
    audit_start = start  # the audit() call's start, after the modules it imports
    if args.child == "model":
        with torch.no_grad():
            inputs = tokenizer(texts, return_tensors="pt", padding=True).to(device)
            out = model.generate(**inputs, max_new_tokens=args.new_tokens, do_sample=False,
                                 min_new_tokens=args.new_tokens)
            model(input_ids=out, attention_mask=torch.ones_like(out))
    else:
        target = attnaudit.from_hf(model, texts, tokenizer=tokenizer, batch_size=2,
                                   max_new_tokens=args.new_tokens, decoding="greedy",
                                   name="llm-scale")
        if args.child == "plan":  # the full audit's plan: its estimate is the measurement
            # as audit() prints it before a full audit of these prompts: no pilot run (on
            # two prompts the pilot would run every protocol, most of the audit itself)
            plan = plan_audit(checked_target(target), AuditOptions(), pilot=False)
            print(plan, file=sys.stderr)
            print(json.dumps({"seconds": plan.seconds, "cpu_seconds": None,
                              "device_peak_gib": None}))
            return
        # the quick audit's progress line on stderr ends with each protocol's time
        run = attnaudit.audit  # imports the audit's modules
        audit_start = time.perf_counter()
        run(target, checks_only=args.child == "check", quick=args.child == "quick",
            progress=args.child in ("quick", "full"))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    print(json.dumps({"seconds": seconds, "cpu_seconds": cpu_seconds, "device_peak_gib": peak,
                      "audit_seconds": time.perf_counter() - audit_start
                      if args.child in ("check", "quick", "full") else None}))


def measure(what: str, tokens: int, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    before = os.getloadavg()[0]
    run = run_child(python_module("benchmarks.llm_scale", "--child", what, "--folder",
                                  str(folder), "--prompt-tokens", str(tokens), "--device",
                                  args.device, *_size_flags(args)))
    result = json.loads(run.stdout.strip().splitlines()[-1])
    return {**result, "rss_gib": run.peak_rss_gib, "load": (before, os.getloadavg()[0]),
            "breakdown": breakdown(run.stderr), "estimate": planned_seconds(run.stderr),
            "plan": run.stderr[run.stderr.find("plan of audit"):].strip()
            if what == "plan" else ""}


def _size_flags(args: argparse.Namespace) -> list[str]:
    """The model's sizes and the lengths and dtype it is built with, as flags for a child."""
    return [*(f"--{k.replace('_', '-')}={getattr(args, k)}" for k in SIZES),
            f"--check-tokens={args.check_tokens}", f"--quick-tokens={args.quick_tokens}",
            f"--new-tokens={args.new_tokens}", f"--dtype={args.dtype}"]


def _seconds(text: str) -> float:
    """``4.4 s`` or ``1:23`` as seconds."""
    if text.endswith(" s"):
        return float(text[:-2])
    minutes, seconds = text.split(":")
    return 60 * int(minutes) + int(seconds)


def planned_seconds(stderr: str) -> tuple[float, float] | None:
    """The total of the plan an audit printed before it ran (``estimate 1:23 in all`` or
    ``estimate 4.4 s in all``: what is left once the plan is made) and what making it took
    (``planned in 4.1 s``), in seconds; None when it printed none."""
    lines = [line for line in stderr.splitlines() if line.strip().startswith("estimate ")]
    heads = [line for line in stderr.splitlines() if "; planned in " in line]
    if not lines or not heads:
        return None
    return (_seconds(lines[0].split("estimate ", 1)[1].split(" in all", 1)[0]),
            _seconds(heads[0].split("; planned in ", 1)[1].strip()))


def breakdown(stderr: str) -> str:
    """The per-protocol times of an audit's last progress line (``done [..]; validity ...
    in 00:03, permutation ...``), or "" when it printed none."""
    done = [line for line in stderr.splitlines() if " done [" in line]
    return done[-1].split("; ", 1)[1] if done and "; " in done[-1] else ""


def main(argv: list[str] | None = None) -> None:
    args = _arguments(argv)
    if args.child == "build":
        print(json.dumps({"parameters": build(Path(args.folder), args)}))
        return
    if args.child:
        child(args)
        return
    print(banner())
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        # built in a child: a process forked from one that held the model reports that
        # process's peak as its own (Linux keeps the parent's high-water mark across exec)
        built = run_child(python_module("benchmarks.llm_scale", "--child", "build", "--folder",
                                        str(folder), *_size_flags(args)))
        params = json.loads(built.stdout.strip().splitlines()[-1])["parameters"]
        print(f"Llama-shaped: {args.layers} layers, hidden {args.hidden}, {args.heads} q / "
              f"{args.kv_heads} kv heads, MLP {args.mlp}, vocabulary {args.vocab}, "
              f"{params / 1e6:.1f}M parameters, {args.dtype} on {args.device}; 2 prompts, "
              f"{args.new_tokens} new tokens")
        plan = [("model", args.check_tokens), ("check", args.check_tokens),
                *[("model", args.quick_tokens), ("quick", args.quick_tokens)]
                * max(args.rounds, 1), ("plan", args.quick_tokens),
                *[("full", args.quick_tokens)] * args.full]
        results: dict[tuple[str, int], dict[str, Any]] = {}
        rounds: list[tuple[dict[str, Any], dict[str, Any]]] = []  # (model, quick) at quick
        for what, tokens in plan:
            r = measure(what, tokens, folder, args)
            if what == "quick":
                rounds.append((results["model", tokens], r))
            results[what, tokens] = r
            device = ("" if r["device_peak_gib"] is None
                      else f", device peak {r['device_peak_gib']:.2f} GiB")
            cpu = "" if r["cpu_seconds"] is None else f" ({r['cpu_seconds']:.2f} s CPU)"
            print(f"{what:>6} at {tokens:>4} prompt tokens: {r['seconds']:8.2f} s{cpu}, peak "
                  f"RSS {r['rss_gib']:.2f} GiB{device}, load {r['load'][0]:.2f} -> "
                  f"{r['load'][1]:.2f}", flush=True)
            if r["breakdown"]:
                print(f"       per protocol: {r['breakdown']}", flush=True)
            if what in ("quick", "full") and r["estimate"]:
                estimate, planning = r["estimate"]
                after = r["audit_seconds"] - planning
                print(f"       its plan (made in {planning:.1f} s) estimated {estimate:.1f} s "
                      f"for the rest; the rest took {after:.1f} s, {after / estimate:.2f}x "
                      "that", flush=True)
            if r["plan"]:
                print("       " + r["plan"].replace("\n", "\n       "), flush=True)
    for what, tokens in (("check", args.check_tokens), ("quick", args.quick_tokens),
                         ("plan", args.quick_tokens), *[("full", args.quick_tokens)] * args.full):
        own, run = results["model", tokens], results[what, tokens]
        ratio = run["seconds"] / own["seconds"]
        rss = run["rss_gib"] / own["rss_gib"]
        cpu = ("" if run["cpu_seconds"] is None
               else f" ({run['cpu_seconds'] / own['cpu_seconds']:.2f}x CPU time)")
        print(f"{LABELS[what]} / model's own work at {tokens} tokens: {ratio:.2f}x time{cpu}, "
              f"{rss:.2f}x peak RSS" + (" (the last round)" if what == "quick"
                                        and len(rounds) > 1 else ""))
    if len(rounds) > 1:
        wall = [q["seconds"] / m["seconds"] for m, q in rounds]
        cpu_ratios = [q["cpu_seconds"] / m["cpu_seconds"] for m, q in rounds]
        print(f"quick audit / model's own work over {len(rounds)} rounds: median "
              f"{statistics.median(wall):.2f}x time ({', '.join(f'{x:.2f}' for x in wall)}), "
              f"{statistics.median(cpu_ratios):.2f}x CPU time "
              f"({', '.join(f'{x:.2f}' for x in cpu_ratios)})")
    print(f"done; {load()}")


if __name__ == "__main__":
    main(sys.argv[1:])
