"""Tiny, offline Hugging Face seq2seq checkpoints for any architecture in the auto-mapping.

:func:`tiny_config` shrinks a config class generically: every size attribute the class knows
(under whichever name it uses) is set to a tiny value, recursively through sub-configs, and
the special token ids are moved into the tiny vocabulary. :func:`save_checkpoint` writes a
seeded random-init model and a matching word-level tokenizer (ids ``0..VOCAB-1``, the
special tokens on the config's own pad / eos / bos / decoder-start ids) with
``save_pretrained``, so that ``AutoModelForSeq2SeqLM`` and ``AutoTokenizer`` load the folder
with ``local_files_only=True``. Nothing is downloaded.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch

VOCAB = 80
D_MODEL = 32
LAYERS = 2
HEADS = 4
KV_HEADS = 2  # grouped-query attention where the config has it
HEAD_DIM = 8
FFN = 64
POSITIONS = 64
INIT_STD = 0.3  # peaked rather than near-uniform attention, so a wrong row or head shows

# Attribute name -> tiny value, applied where the config class takes that argument.
TINY: dict[str, Any] = {
    # vocabularies
    "vocab_size": VOCAB, "src_vocab_size": VOCAB, "tgt_vocab_size": VOCAB,
    "decoder_vocab_size": VOCAB,
    # widths
    "d_model": D_MODEL, "hidden_size": D_MODEL,
    "d_kv": HEAD_DIM, "head_dim": HEAD_DIM, "query_pre_attn_scalar": HEAD_DIM,
    "encoder_ffn_dim": FFN, "decoder_ffn_dim": FFN, "d_ff": FFN, "intermediate_size": FFN,
    # depths
    "encoder_layers": LAYERS, "decoder_layers": LAYERS, "num_layers": LAYERS,
    "num_decoder_layers": LAYERS, "num_encoder_layers": LAYERS, "num_hidden_layers": LAYERS,
    # heads
    "encoder_attention_heads": HEADS, "decoder_attention_heads": HEADS, "num_heads": HEADS,
    "num_attention_heads": HEADS, "num_encoder_attention_heads": HEADS,
    "num_decoder_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
    # position limits
    "max_position_embeddings": POSITIONS, "max_encoder_position_embeddings": POSITIONS,
    "max_decoder_position_embeddings": POSITIONS, "max_source_positions": POSITIONS,
    "max_target_positions": POSITIONS,
    # initialisation
    "init_std": INIT_STD, "initializer_range": INIT_STD,
    # mixture of experts: two small experts, every other layer sparse
    "num_experts": 2, "expert_capacity": 64, "num_sparse_encoder_layers": 1,
    "num_sparse_decoder_layers": 1, "encoder_sparse_step": 2, "decoder_sparse_step": 2,
    # long-input attention variants, scaled to a handful of tokens
    "attention_window": 4, "num_global_tokens": 2, "local_radius": 2, "global_block_size": 2,
    "block_size": 2, "num_random_blocks": 1,
    # speech / unit / vision towers some text-to-text classes still configure
    "speech_encoder_layers": 1, "speech_encoder_attention_heads": 2,
    "speech_encoder_intermediate_size": FFN, "t2u_encoder_layers": 1, "t2u_decoder_layers": 1,
    "t2u_encoder_ffn_dim": FFN, "t2u_decoder_ffn_dim": FFN, "t2u_vocab_size": VOCAB,
    "char_vocab_size": VOCAB, "unit_hifi_gan_vocab_size": VOCAB,
    "image_size": 16, "patch_size": 8, "mm_tokens_per_image": 4,
}

# Only ever lowered: a default already below the tiny value stays.
NOT_RAISED = {"expert_capacity"}
# Switched off: random or layer dropping would make two loads of one checkpoint disagree.
OFF = ("dropout", "attention_dropout", "activation_dropout", "dropout_rate",
       "encoder_layerdrop", "decoder_layerdrop", "router_jitter_noise")
SPECIAL_IDS = ("pad_token_id", "eos_token_id", "bos_token_id", "decoder_start_token_id")


def _init_params(cls: type) -> set[str]:
    return set(inspect.signature(cls.__init__).parameters) - {"self", "kwargs"}


def _tiny_kwargs(cls: type, default: Any, extra: dict[str, Any],
                 sizes: dict[str, Any]) -> dict[str, Any]:
    params = _init_params(cls)
    kwargs: dict[str, Any] = {}
    for name, value in sizes.items():
        if name not in params:
            continue
        current = getattr(default, name, None)
        if name in NOT_RAISED and isinstance(current, int) and current < value:
            continue
        if isinstance(current, list | tuple) and name == "attention_window":
            value = [value] * LAYERS
        kwargs[name] = value
    kwargs.update({name: 0.0 for name in OFF if name in params})
    for name, sub_cls in (getattr(cls, "sub_configs", None) or {}).items():
        sub_default = getattr(default, name, None)
        if sub_default is None:
            continue
        sub_cls = type(sub_default) if sub_cls.__name__ == "AutoConfig" else sub_cls
        kwargs[name] = tiny_sub_config(sub_cls, sub_default, extra.get(name, {}), sizes)
    subs = getattr(cls, "sub_configs", None) or {}
    kwargs.update({k: v for k, v in extra.items() if not isinstance(v, dict) or k not in subs})
    return kwargs


def tiny_sub_config(cls: type, default: Any, extra: dict[str, Any],
                    sizes: dict[str, Any] | None = None) -> Any:
    return cls(**_tiny_kwargs(cls, default, extra, TINY if sizes is None else sizes))


def tiny_config(config_cls: type, extra: dict[str, Any] | None = None,
                sizes: dict[str, Any] | None = None) -> Any:
    """A tiny instance of ``config_cls``; ``extra`` overrides (a dict value: a sub-config's);
    ``sizes``: the attribute -> tiny value table (default :data:`TINY`)."""
    extra = dict(extra or {})
    default = default_config(config_cls, extra)
    config = config_cls(**_tiny_kwargs(config_cls, default, extra,
                                       TINY if sizes is None else sizes))
    _fix_special_ids(config)
    return config


def default_config(config_cls: type, extra: dict[str, Any] | None = None) -> Any:
    """``config_cls``'s default; where the class's own validation refuses that (Gemma 4's
    assistant defaults to a text config it does not accept), the default with ``extra``'s
    sub-config overrides, which then must make it valid."""
    try:
        return config_cls()
    except Exception:  # transformers' validation errors share no base class
        subs = getattr(config_cls, "sub_configs", None) or {}
        overrides = {k: v for k, v in (extra or {}).items() if k in subs and isinstance(v, dict)}
        if not overrides:
            raise
        return config_cls(**overrides)


def _fix_special_ids(config: Any) -> None:
    """Move pad / eos / bos / decoder-start into the tiny vocabulary, keeping which of them
    coincide; a missing decoder start becomes pad (T5 style) or eos (BART style) as the
    released checkpoints of those families set it."""
    holders = [config] + [getattr(config, name) for name in
                          (getattr(type(config), "sub_configs", None) or {})
                          if getattr(config, name, None) is not None]
    values = {name: getattr(config, name, None) for name in SPECIAL_IDS}
    for holder in holders[1:]:  # ids some configs only keep on a sub-config
        for name in SPECIAL_IDS:
            if values[name] is None and isinstance(getattr(holder, name, None), int):
                values[name] = getattr(holder, name)
    if values["pad_token_id"] is None:
        values["pad_token_id"] = 0
    if values["eos_token_id"] is None:
        values["eos_token_id"] = 1 if values["pad_token_id"] != 1 else 2
    if isinstance(values["eos_token_id"], list | tuple):
        values["eos_token_id"] = values["eos_token_id"][0]
    if values["decoder_start_token_id"] is None:
        t5_style = values["bos_token_id"] is None or values["pad_token_id"] == 0
        values["decoder_start_token_id"] = (values["pad_token_id"] if t5_style
                                            else values["eos_token_id"])
    remap: dict[int, int] = {}
    for value in values.values():
        if value is not None and value >= VOCAB and value not in remap:
            remap[value] = VOCAB - 1 - len(remap)
    for name, value in values.items():
        new = remap.get(value, value) if value is not None else None
        for holder in holders:
            if holder is config or hasattr(holder, name):
                setattr(holder, name, new)


def special_tokens(config: Any) -> dict[int, str]:
    """Id -> token for the special ids the config uses."""
    names = {"pad_token_id": "<pad>", "eos_token_id": "</s>", "bos_token_id": "<s>",
             "decoder_start_token_id": "<start>"}
    tokens: dict[int, str] = {}
    for attr, token in names.items():
        value = getattr(config, attr, None)
        if value is not None and value not in tokens:
            tokens[value] = token
    return tokens


def save_checkpoint(model_cls: type, config: Any, folder: Path, seed: int = 0,
                    eos_after: bool = True) -> list[str]:
    """Save a seeded random-init model and a word-level tokenizer; return the word list.

    eos_after: the tokenizer ends every text with the end-of-sequence token (a seq2seq
    source does; a causal LM's prompt does not)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    torch.manual_seed(seed)
    model = model_cls(config).eval()
    model.save_pretrained(folder)

    specials = special_tokens(config)
    unk_id = next(i for i in range(VOCAB) if i not in specials)
    specials[unk_id] = "<unk>"
    vocab = {token: i for i, token in specials.items()}
    words = [f"w{i}" for i in range(VOCAB) if i not in specials]
    vocab.update({word: i for word, i in zip(words, (i for i in range(VOCAB)
                                                      if i not in specials), strict=True)})
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = WhitespaceSplit()
    eos = specials[config.eos_token_id]
    if eos_after:
        tok.post_processor = TemplateProcessing(single=f"$A {eos}",
                                                special_tokens=[(eos, config.eos_token_id)])
    roles = {"pad_token_id": "pad_token", "eos_token_id": "eos_token",
             "bos_token_id": "bos_token"}
    kwargs = {role: specials[getattr(config, attr)] for attr, role in roles.items()
              if getattr(config, attr, None) is not None}
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", **kwargs)
    fast.save_pretrained(folder)
    return words
