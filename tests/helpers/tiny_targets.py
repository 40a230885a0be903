"""Tiny Hugging Face targets of the families contribution measures cover: BART and Marian
(post-LN), T5 (pre-LN, RMSNorm), GPT-2 (decoder-only, pre-LN) and Llama (decoder-only,
RMSNorm, grouped-query attention), saved with :mod:`tests.helpers.tiny_hf` and loaded with
``from_hf``; and the same folder loaded with the eager backend for ground truth."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from tests.helpers.tiny_hf import VOCAB, save_checkpoint, tiny_config

SEQ2SEQ = ("bart", "marian", "t5")
CAUSAL = ("gpt2", "llama")
SOURCES = ["w5 w6 w7 w8 w9", "w10 w11", "w12 w13 w14"]
NEW_TOKENS = 4


def _classes(name: str) -> tuple[Any, Any]:
    import transformers

    return {
        "bart": (transformers.BartConfig, transformers.BartForConditionalGeneration),
        "marian": (transformers.MarianConfig, transformers.MarianMTModel),
        "t5": (transformers.T5Config, transformers.T5ForConditionalGeneration),
        "gpt2": (transformers.GPT2Config, transformers.GPT2LMHeadModel),
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    }[name]


def causal_config(name: str, layers: int = 2) -> Any:
    config_cls, _ = _classes(name)
    common = {"vocab_size": VOCAB, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
    if name == "gpt2":
        return config_cls(n_positions=32, n_embd=32, n_layer=layers, n_head=4,
                          initializer_range=0.3, **common)
    return config_cls(hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                      initializer_range=0.3, **common)


def save_tiny(name: str, folder: Path, layers: int | None = None) -> Path:
    """Save the tiny ``name`` checkpoint (``layers`` overriding the depth) into ``folder``."""
    config_cls, model_cls = _classes(name)
    if name in CAUSAL:
        save_checkpoint(model_cls, causal_config(name, layers or 2), folder, eos_after=False)
        return folder
    extra = {} if layers is None else {"encoder_layers": layers, "decoder_layers": layers,
                                       "num_layers": layers, "num_decoder_layers": layers}
    save_checkpoint(model_cls, tiny_config(config_cls, extra), folder)
    return folder


def eager_model(name: str, folder: Path) -> torch.nn.Module:
    """The checkpoint loaded a second time with the eager backend (never captured)."""
    _, model_cls = _classes(name)
    return model_cls.from_pretrained(folder, attn_implementation="eager").eval()


def decoder_inputs(model: torch.nn.Module, emitted: torch.Tensor) -> torch.Tensor:
    """(B, T): the decoder start token, then ``emitted[:, :-1]``."""
    start = torch.full_like(emitted[:, :1], model.config.decoder_start_token_id)
    return torch.cat([start, emitted[:, :-1]], dim=1)


def prompt_inputs(batch: Any, emitted: torch.Tensor) -> dict[str, torch.Tensor]:
    """A causal LM's keyword inputs for prompt + ``emitted[:, :-1]`` in one pass, written
    out by hand: the ids, their mask, position ids counting real tokens (padding at 0)."""
    prefix = emitted[:, :-1]
    ids = torch.cat([batch.source_ids, prefix], dim=1)
    mask = torch.cat([batch.source_mask.long(), torch.ones_like(prefix)], dim=1)
    return {"input_ids": ids, "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp_min(0), "use_cache": False}


def tiny_gpt2_report(tmp_path_factory, *, interventions: bool) -> Path:
    """The report of a quick audit (``interventions``: with the suite) of a tiny random GPT-2
    continuing two prompts; the folder it is written in."""
    import transformers

    import attnaudit
    from tests.helpers.tiny_hf import VOCAB, save_checkpoint

    folder = tmp_path_factory.mktemp("gpt2")
    config = transformers.GPT2Config(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2,
                                     pad_token_id=0, n_positions=32, n_embd=32, n_layer=2,
                                     n_head=4, initializer_range=0.3)
    save_checkpoint(transformers.GPT2LMHeadModel, config, folder, eos_after=False)
    target = attnaudit.from_hf(folder, ["w5 w6 w7 w8 w9", "w10 w11 w12"], max_new_tokens=4)
    out = tmp_path_factory.mktemp("gpt2_report")
    attnaudit.audit(target, quick=True, interventions=interventions, progress=False).save(out)
    return out


def counting_starts(target: Any) -> tuple[Any, list[int]]:
    """The target with ``teacher_forced_from`` wrapped: the list of starts it ran from."""
    starts: list[int] = []
    inner = target.teacher_forced_from

    def counted(batch: Any, states: Any, emitted: torch.Tensor, start: int) -> torch.Tensor:
        starts.append(start)
        return inner(batch, states, emitted, start)

    return dataclasses.replace(target, teacher_forced_from=counted), starts
