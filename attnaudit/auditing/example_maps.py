"""The first audited example's attention at every site, trimmed to real tokens and labelled:
what the report's heatmaps draw; and its cross-attention rolled up to source words (sum
over each word's tokens, :mod:`attnaudit.analysis.aggregation`), the report's word table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from attnaudit.analysis.aggregation import (
    aggregate,
    group_labels,
    words_from_offsets,
    words_from_tokens,
)
from attnaudit.record import AttentionRecord
from attnaudit.target import Batch, Seq2SeqTarget

WORD_COLUMNS = ["site", "step", "target_token", "word", "word_text", "attention", "rule"]


@dataclass
class AttentionMap:
    """One site's weights for one example, trimmed to real tokens.

    weights: (heads, queries, keys) float32. Query and key labels name the tokens
    (target steps for decoder queries, source tokens for encoder positions).
    """

    site: str
    role: str
    weights: np.ndarray
    query_labels: list[str]
    key_labels: list[str]


@dataclass
class ExampleMaps:
    """The first audited example and its attention map at every site.

    words: per real source token (the maps' key axis of cross sites), its word index or -1;
    word_rule: how words were found (``offsets``, ``located`` or ``markers``; empty: not
    known).
    """

    source: str
    source_tokens: list[str]
    target_tokens: list[str]
    maps: dict[str, AttentionMap]
    words: list[int] = field(default_factory=list)
    word_rule: str = ""


def source_words(target: Seq2SeqTarget, batch: Batch) -> tuple[list[list[int]], str]:
    """Per example, per source position its word index (-1: padding, special tokens) and
    the rule: the tokenizer's offsets (``batch.inputs["offsets"]``) when the target gives
    them, else the token labels located in the text or their markers."""
    keep = target.explain_keys(batch).cpu()
    offsets = batch.inputs.get("offsets")
    if isinstance(offsets, torch.Tensor) and offsets.shape[:2] == batch.source_ids.shape:
        return [words_from_offsets(text, row, k)
                for text, row, k in zip(batch.texts, offsets.cpu(), keep, strict=True)], "offsets"
    found = [words_from_tokens(tokens, k, text) for tokens, k, text in
             zip(target.source_tokens(batch), keep, batch.texts, strict=True)]
    rules = {rule for _, rule in found}
    return [words for words, _ in found], "markers" if "markers" in rules else "located"


def word_attention_table(example: ExampleMaps) -> pd.DataFrame:
    """Example 0's cross-attention per source word: one row per cross site, step and word;
    attention = the sum of the word's token weights, averaged over heads."""
    rows = []
    if example.words:
        groups = torch.tensor(example.words)
        labels = group_labels(example.source_tokens, groups)
        for site, amap in example.maps.items():
            if amap.role != "cross":
                continue
            per_word = aggregate(torch.from_numpy(amap.weights).mean(0), groups,
                                 len(labels))  # (Q, words)
            for step, values in enumerate(per_word.tolist()):
                rows.extend({"site": site, "step": step, "target_token": amap.query_labels[step],
                             "word": word, "word_text": labels[word], "attention": value,
                             "rule": example.word_rule}
                            for word, value in enumerate(values))
    return pd.DataFrame(rows, columns=WORD_COLUMNS)


def example_maps(records: Mapping[str, AttentionRecord], roles: Mapping[str, str],
                 source: str, source_tokens: Sequence[object], target_tokens: Sequence[object],
                 source_mask: torch.Tensor, step_mask: torch.Tensor,
                 words: Sequence[int] = (), word_rule: str = "") -> ExampleMaps:
    """Example 0 of ``records`` at every site, on its real source tokens and steps up to EOS.

    Args:
        records: site -> record; example 0 of each is drawn.
        roles: site -> cross, encoder_self, decoder_self or captured (captured sites keep
            every query and key, labelled by index).
        source: the example's source text.
        source_tokens, target_tokens: a label per source position and per emitted step.
        source_mask: bool (n,), real source tokens. step_mask: bool (T,), steps up to EOS.
        words, word_rule: per source position its word index (:func:`source_words`).
    """
    src = torch.nonzero(source_mask).squeeze(1)
    tgt = torch.nonzero(step_mask).squeeze(1)
    src_labels = [str(source_tokens[i]) for i in src.tolist()]
    tgt_labels = [str(target_tokens[i]) for i in tgt.tolist()]
    axes = {"cross": (tgt, tgt_labels, src, src_labels),
            "encoder_self": (src, src_labels, src, src_labels),
            "decoder_self": (tgt, tgt_labels, tgt, tgt_labels)}
    maps = {}
    for name, record in records.items():
        weights = record.weights[0]  # (H, Q, K)
        role = roles[name]
        if role in axes:
            q_index, q_labels, k_index, k_labels = axes[role]
            weights = weights[:, q_index.to(weights.device)][:, :, k_index.to(weights.device)]
        else:
            q_labels = [str(i) for i in range(weights.shape[1])]
            k_labels = [str(i) for i in range(weights.shape[2])]
        maps[name] = AttentionMap(name, role, weights.float().cpu().numpy(), q_labels, k_labels)
    kept_words = [int(words[i]) for i in src.tolist()] if len(words) else []
    return ExampleMaps(source, src_labels, tgt_labels, maps, kept_words, word_rule)
