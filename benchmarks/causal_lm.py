"""Decoder-only targets: an edited step run from the key/value cache vs the prefix re-run,
side by side in one run.

    python -m benchmarks.causal_lm [--prompts 16] [--prompt-words 32] [--new-tokens 16]

A GPT-2 built from a small config (4 layers, width 128, vocabulary 1,000; seeded random
weights, nothing downloaded) continues word-level prompts greedily; the permutation test
(20 permutations per row) runs once with edited steps from the cache of the unedited pass
(``decode_states`` / ``decode_step``) and once re-running prompt and prefix. Prints both
times, their ratio and the largest difference between the two TVD columns. The machine may
be shared, so only the side-by-side ratio is meaningful.
"""

from __future__ import annotations

import time

import torch

from attnaudit.interventions.permutation import permutation_test
from attnaudit.interventions.reference_run import reference
from attnaudit.targets.hf.loading import from_hf
from benchmarks.harness import banner, load, parser

VOCAB = 1000
PERMUTATIONS = 20


def build(prompts: int, words: int, new_tokens: int, *, vocab: int = VOCAB, width: int = 128,
          layers: int = 4, batch_size: int | None = None, contrast_words: int = 0):
    """A seeded GPT-2 target of the given size over seeded word-level prompts; with
    ``contrast_words``, a seeded contrast continuation of that many words per prompt."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=vocab, n_positions=128, n_embd=width, n_layer=layers,
                        n_head=4, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = GPT2LMHeadModel(config).eval()
    words_of = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3,
                **{f"w{i}": i for i in range(4, vocab)}}
    tok = Tokenizer(WordLevel(words_of, unk_token="<unk>"))
    tok.pre_tokenizer = WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>",
                                        pad_token="<pad>", eos_token="</s>", bos_token="<s>")
    gen = torch.Generator().manual_seed(1)

    def text(n: int) -> str:
        return " ".join(f"w{i}" for i in torch.randint(4, vocab, (n,), generator=gen))

    texts = [text(int(n)) for n in torch.randint(words // 2, words + 1, (prompts,),
                                                  generator=gen)]
    contrast = [text(contrast_words) for _ in texts] if contrast_words else None
    return from_hf(model, texts, tokenizer=tokenizer, batch_size=batch_size or prompts,
                   max_new_tokens=new_tokens, name="gpt2-bench", contrast=contrast)


def main() -> None:
    options = parser(__spec__.name, __doc__)
    options.add_argument("--prompts", type=int, default=16)
    options.add_argument("--prompt-words", type=int, default=32)
    options.add_argument("--new-tokens", type=int, default=16)
    args = options.parse_args()
    print(banner())
    target = build(args.prompts, args.prompt_words, args.new_tokens)
    batch = next(target.iter_batches())
    times, frames = {}, {}
    for label, incremental in (("cached step", True), ("prefix re-run", False)):
        ref = reference(target, batch, incremental=incremental)
        start = time.perf_counter()
        frames[label] = permutation_test(target, ref, n_permutations=PERMUTATIONS)
        times[label] = time.perf_counter() - start
    rows = len(frames["cached step"])
    diff = (frames["cached step"]["perm_median_tvd"]
            - frames["prefix re-run"]["perm_median_tvd"]).abs().max()
    print(f"{args.prompts} prompts of up to {args.prompt_words} words, {rows} rows, "
          f"{PERMUTATIONS} permutations each")
    for label, seconds in times.items():
        print(f"  {label:14s} {seconds:7.2f} s")
    print(f"  ratio (re-run / cached) {times['prefix re-run'] / times['cached step']:.2f}x; "
          f"largest |TVD difference| {diff:.2e}")
    print(f"{load()} at the end")


if __name__ == "__main__":
    main()
