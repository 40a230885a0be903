"""A small Hugging Face BART for the date task, with a character-level tokenizer.

The tokenizer maps every character to exactly one token (a ``WordLevel`` model over single
characters behind a pre-tokenizer that isolates each character, spaces included) and its
post-processor appends ``</s>``. So for a source string ``s`` of ``n`` characters::

    tokenizer(s)["input_ids"]  # length n + 1: token i is character s[i], token n is </s>

and a character span ``range(a, b)`` of the source (e.g. ``year_span(s)``) is the token span
``range(a, b)`` of the encoder input, with no offset. Right padding (``<pad>`` = 0) keeps
this true in a batch. Characters outside the vocabulary become ``<unk>``, still one token
each. ``tokenizer.decode(ids, skip_special_tokens=True)`` returns the string exactly.

Special tokens: ``<pad>`` = 0, ``<s>`` = 1, ``</s>`` = 2, ``<unk>`` = 3; then the characters
of all 9,000 sources and targets in sorted order (one vocabulary shared by encoder and
decoder, whose embeddings BART ties). The decoder starts from ``<s>``
(``decoder_start_token_id`` = 1) and is trained to emit the ISO characters then ``</s>``, so
decoder step t (t >= 1) reads ISO character t - 1 and predicts character t (or ``</s>``).

Everything loads from :data:`MODEL_DIR` offline; nothing touches the Hugging Face hub.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import (
    AutoTokenizer,
    BartConfig,
    BartForConditionalGeneration,
    GenerationConfig,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

MODEL_DIR = Path(__file__).resolve().parent / "model"
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
ISO_CHARS = 10  # "YYYY-MM-DD"
MAX_NEW_TOKENS = ISO_CHARS + 2  # ten characters, </s>, one spare


def build_tokenizer(chars: Iterable[str]) -> PreTrainedTokenizerFast:
    """Character-level tokenizer over ``chars`` (single characters, specials first)."""
    chars = sorted(set(chars))
    if any(len(c) != 1 for c in chars):
        raise ValueError("build_tokenizer expects single characters")
    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *chars])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", EOS_ID)]
    )
    backend.decoder = decoders.Fuse()  # concatenate characters, no separators added
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
        model_max_length=64,
        padding_side="right",
    )


def build_model(vocab_size: int) -> BartForConditionalGeneration:
    """Freshly initialised small BART (2 + 2 layers, d_model 128, 4 heads, ffn 256)."""
    config = BartConfig(
        vocab_size=vocab_size,
        max_position_embeddings=64,
        d_model=128,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=256,
        decoder_ffn_dim=256,
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        decoder_start_token_id=BOS_ID,
        forced_eos_token_id=None,
        tie_word_embeddings=True,
    )
    model = BartForConditionalGeneration(config)
    model.generation_config = GenerationConfig(
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        decoder_start_token_id=BOS_ID,
        max_new_tokens=MAX_NEW_TOKENS,
        num_beams=1,
        do_sample=False,
    )
    return model


def load_model(
    model_dir: str | Path = MODEL_DIR,
) -> tuple[BartForConditionalGeneration, PreTrainedTokenizerBase]:
    """The saved model (eval mode, default sdpa attention) and its tokenizer, offline."""
    model = BartForConditionalGeneration.from_pretrained(
        model_dir, local_files_only=True, attn_implementation="sdpa"
    )
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    return model.eval(), tokenizer


@torch.no_grad()
def greedy(
    model: BartForConditionalGeneration,
    tokenizer: PreTrainedTokenizerBase,
    sources: list[str],
    batch_size: int = 500,
) -> list[str]:
    """Greedy-decode each source to a string (special tokens removed).

    Each chunk is encoded to ``input_ids`` ``(batch, max_len + 1)`` and ``generate`` returns
    ``(batch, <= 1 + MAX_NEW_TOKENS)`` ids beginning with ``<s>``.
    """
    was_training = model.training
    model.eval()
    out: list[str] = []
    for start in range(0, len(sources), batch_size):
        enc = tokenizer(sources[start : start + batch_size], padding=True, return_tensors="pt")
        ids = model.generate(
            input_ids=enc["input_ids"],
            attention_mask=enc["attention_mask"],
            do_sample=False,
            num_beams=1,
            max_new_tokens=MAX_NEW_TOKENS,
        )
        out.extend(tokenizer.batch_decode(ids, skip_special_tokens=True))
    model.train(was_training)
    return out


def exact_match(
    model: BartForConditionalGeneration,
    tokenizer: PreTrainedTokenizerBase,
    pairs: list[tuple[str, str]],
) -> float:
    """Fraction of ``(source, iso)`` pairs whose greedy output equals ``iso`` exactly."""
    emitted = greedy(model, tokenizer, [s for s, _ in pairs])
    return sum(e == t for e, (_, t) in zip(emitted, pairs, strict=True)) / len(pairs)
