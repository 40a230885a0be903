"""Source words of a target's data, and the first example's attention and importances per
word (the report's word tables).

Words come from the tokenizer's character offsets when the target gives them
(``batch.inputs["offsets"]``, as :func:`attnaudit.from_hf` does), else from the source
token labels located in the text, else from their word-start markers
(:mod:`attnaudit.analysis.aggregation` states each rule). A word's value is the sum over
its tokens: attention mass, or a signed attribution score.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import pandas as pd
import torch

from attnaudit.analysis.aggregation import (
    aggregate,
    group_labels,
    words_from_offsets,
    words_from_tokens,
)
from attnaudit.targets.contract import Batch, Seq2SeqTarget

if TYPE_CHECKING:
    from attnaudit.analysis.example_maps import ExampleMaps

ATTENTION_COLUMNS = ["site", "step", "target_token", "word", "word_text", "attention", "rule"]
IMPORTANCE_COLUMNS = ["method", "step", "target_token", "word", "word_text",
                      "value", "rule"]


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
    rows: list[dict[str, object]] = []
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
    return pd.DataFrame(rows, columns=ATTENTION_COLUMNS)


def word_importance_table(target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor,
                          importances: Mapping[str, torch.Tensor], steps: torch.Tensor
                          ) -> pd.DataFrame:
    """Example 0 of ``batch`` per source word: one row per method, counted step and word.

    emitted: (B, T) the output ids (they label the steps). importances: name -> (B, T, n)
    importance of each source key at each step (attention, attributions, leave-one-out).
    steps: bool (B, T), the steps counted. value = the sum of the word's token values.
    """
    words, rule = source_words(target, batch.select([0]))
    groups = torch.tensor(words[0])
    labels = group_labels(target.source_tokens(batch.select([0]))[0], groups)
    counted = steps[0].cpu().nonzero().squeeze(1).tolist()
    step_labels = target.target_tokens(emitted[:1])[0]
    rows: list[dict[str, object]] = []
    if labels:
        for method, values in importances.items():
            per_word = aggregate(values[0].detach().cpu(), groups, len(labels))  # (T, words)
            for step in counted:
                rows.extend({"method": method, "step": step,
                             "target_token": str(step_labels[step]), "word": word,
                             "word_text": labels[word], "value": float(per_word[step, word]),
                             "rule": rule}
                            for word in range(len(labels)))
    return pd.DataFrame(rows, columns=IMPORTANCE_COLUMNS)
