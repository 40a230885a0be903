"""A long-prompt decoder-only report: a tiny random GPT-2 (2 layers, 4 heads, width 32, built
from a config, nothing downloaded) continuing one prompt of :data:`PROMPT_TOKENS` words for
:data:`NEW_TOKENS` steps, audited quickly without interventions, and the eager attentions
of the same model over the prompt and its continuation (``output_attentions=True``), read as
the report's prompt view reads them: each continuation row's weights over the prompt,
renormalised over those keys (:mod:`attnaudit.capturing.views`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import attnaudit

PROMPT_TOKENS = 4096
NEW_TOKENS = 6


@dataclass
class LongReport:
    """index: the page. maps, tops: ``attention_maps.csv`` and ``attention_top_keys.csv``.
    rows: float64 (layers, heads, steps, prompt tokens), the eager weights of each
    continuation step's query (the position emitting it) over the prompt, renormalised over
    the prompt's keys."""

    index: Path
    maps: pd.DataFrame
    tops: pd.DataFrame
    rows: np.ndarray


def long_prompt_report(tmp_path_factory) -> LongReport:
    transformers = pytest.importorskip("transformers")
    import torch

    from tests.helpers.tiny_hf import VOCAB, save_checkpoint

    folder = tmp_path_factory.mktemp("long_gpt2")
    config = transformers.GPT2Config(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2,
                                     pad_token_id=0, n_positions=PROMPT_TOKENS + 16,
                                     n_embd=32, n_layer=2, n_head=4, initializer_range=0.3)
    save_checkpoint(transformers.GPT2LMHeadModel, config, folder, eos_after=False)
    words = np.random.default_rng(0).integers(5, VOCAB, PROMPT_TOKENS)
    prompt = " ".join(f"w{i}" for i in words)
    target = attnaudit.from_hf(folder, [prompt], max_new_tokens=NEW_TOKENS)
    out = tmp_path_factory.mktemp("long_report")
    index = attnaudit.audit(target, quick=True, interventions=False, progress=False).save(out)
    maps = pd.read_csv(out / "attention_maps.csv", keep_default_na=False,
                       dtype={"query_token": str, "key_token": str})
    tops = pd.read_csv(out / "attention_top_keys.csv", keep_default_na=False,
                       dtype={"query_token": str, "key_token": str})

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, local_files_only=True, attn_implementation="eager").eval()
    ids = tokenizer(prompt)["input_ids"]
    assert len(ids) == PROMPT_TOKENS
    steps = (maps[(maps["view"] == "cross") & (maps["layer"] == 0) & (maps["head"] == 0)
                  & (maps["key"] == 0)].sort_values("query")["query_token"].tolist())
    emitted = tokenizer.convert_tokens_to_ids(steps)
    with torch.no_grad():
        attentions = model(torch.tensor([ids + emitted]), output_attentions=True).attentions
    # step t is emitted by position len(ids) - 1 + t, which reads every prompt token
    first = len(ids) - 1
    raw = np.stack([a[0, :, first:first + len(steps), :len(ids)].double().numpy()
                    for a in attentions])
    return LongReport(index, maps, tops, raw / raw.sum(-1, keepdims=True))
