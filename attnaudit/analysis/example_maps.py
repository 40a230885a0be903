"""The first audited example's attention at every site, trimmed to real tokens and labelled:
what the report's heatmaps draw (and, per word, :mod:`attnaudit.analysis.words`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from attnaudit.record import AttentionRecord


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
        words, word_rule: per source position its word index and the rule
            (:func:`attnaudit.analysis.words.source_words`).
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
