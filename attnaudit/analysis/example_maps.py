"""An audited example's attention at every site, trimmed to real tokens and labelled: what
the report's heatmaps and its attention explorer draw (and, per word,
:mod:`attnaudit.analysis.words`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from attnaudit.analysis.base import as_4d
from attnaudit.record import AttentionRecord

START_LABEL = "<start>"  # the decoder's first input (a decoder-only model: the prompt's end)


@dataclass
class AttentionMap:
    """One site's weights for one example, trimmed to real tokens.

    weights: (heads, queries, keys) float32. Query and key labels name the tokens: a
    decoder query by the token its step emits, a decoder self-attention key by the input it
    holds (:data:`START_LABEL`, then the tokens emitted before), a source position by its
    token.
    eligible: bool (heads, queries, keys), the keys each row may attend (the declared rule
        AND the key mask capture saw), or None when not known.
    row_sum, masked_mass: float64 (heads, queries): each kept row's weight sum and its
        weight on ineligible keys, over *all* of the row's keys, trimmed ones included
        (weight on padding is masked mass even though its column is not drawn); None when
        not known.
    measures: other per-cell measures on the same axes by name, each (heads or 1,
        queries, keys) float32 (value-norm contributions, attributions...); the explorer
        shows every one beside ``weights``.
    """

    site: str
    role: str
    weights: np.ndarray
    query_labels: list[str]
    key_labels: list[str]
    eligible: np.ndarray | None = None
    row_sum: np.ndarray | None = None
    masked_mass: np.ndarray | None = None
    measures: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class ExampleMaps:
    """An audited example and its attention map at every site.

    words: per real source token (the maps' key axis of cross sites), its word index or -1;
    word_rule: how words were found (``offsets``, ``located`` or ``markers``; empty: not
    known). index: the example's position in the audited data.
    """

    source: str
    source_tokens: list[str]
    target_tokens: list[str]
    maps: dict[str, AttentionMap]
    words: list[int] = field(default_factory=list)
    word_rule: str = ""
    index: int = 0


def example_maps(records: Mapping[str, AttentionRecord], roles: Mapping[str, str],
                 source: str, source_tokens: Sequence[object], target_tokens: Sequence[object],
                 source_mask: torch.Tensor, step_mask: torch.Tensor,
                 words: Sequence[int] = (), word_rule: str = "", *, example: int = 0,
                 declared: Mapping[str, torch.Tensor | None] | None = None,
                 index: int = 0) -> ExampleMaps:
    """Example ``example`` of ``records`` at every site, on its real source tokens and
    steps up to EOS.

    Args:
        records: site -> record; example ``example`` of each is drawn.
        roles: site -> cross, encoder_self, decoder_self or captured (captured sites keep
            every query and key, labelled by index).
        source: the example's source text.
        source_tokens, target_tokens: a label per source position and per emitted step.
        source_mask: bool (n,), real source tokens. step_mask: bool (T,), steps up to EOS.
        words, word_rule: per source position its word index and the rule
            (:func:`attnaudit.analysis.words.source_words`).
        example: the example's row in the records' batch.
        declared: site -> the declared eligible keys for the whole batch (read by rank as
            in :func:`attnaudit.analysis.base.as_4d`; None: the captured mask alone); with
            it every map holds its eligibility, row sums and masked mass.
        index: the example's position in the audited data.
    """
    src = torch.nonzero(source_mask).squeeze(1)
    tgt = torch.nonzero(step_mask).squeeze(1)
    src_labels = [str(source_tokens[i]) for i in src.tolist()]
    tgt_labels = [str(target_tokens[i]) for i in tgt.tolist()]
    # a decoder's step t reads its inputs: the start token, then the tokens emitted before t
    inputs = [START_LABEL, *tgt_labels[:-1]] if tgt_labels else []
    axes = {"cross": (tgt, tgt_labels, src, src_labels),
            "encoder_self": (src, src_labels, src, src_labels),
            "decoder_self": (tgt, tgt_labels, tgt, inputs)}
    maps = {}
    for name, record in records.items():
        weights = record.weights[example]  # (H, Q, K)
        role = roles[name]
        if role in axes:
            q_index, q_labels, k_index, k_labels = axes[role]
            q_index, k_index = q_index.to(weights.device), k_index.to(weights.device)
        else:
            q_index = torch.arange(weights.shape[1], device=weights.device)
            k_index = torch.arange(weights.shape[2], device=weights.device)
            q_labels = [str(i) for i in range(weights.shape[1])]
            k_labels = [str(i) for i in range(weights.shape[2])]
        amap = AttentionMap(name, role, _trim(weights, q_index, k_index).float().cpu().numpy(),
                            q_labels, k_labels)
        if declared is not None:
            _add_validity(amap, record, declared.get(name), example, q_index, k_index)
        maps[name] = amap
    kept_words = [int(words[i]) for i in src.tolist()] if len(words) else []
    return ExampleMaps(source, src_labels, tgt_labels, maps, kept_words, word_rule, index)


def _trim(t: torch.Tensor, q_index: torch.Tensor, k_index: torch.Tensor) -> torch.Tensor:
    """(H, Q, K) -> the kept queries and keys."""
    return t[:, q_index][:, :, k_index]


def _add_validity(amap: AttentionMap, record: AttentionRecord, declared: torch.Tensor | None,
                  example: int, q_index: torch.Tensor, k_index: torch.Tensor) -> None:
    """The map's eligibility, and its kept rows' sums and masked mass over all keys."""
    weights = record.weights
    shape = tuple(weights.shape)
    eligible = torch.ones(shape[1:], dtype=torch.bool, device=weights.device)
    for mask, what in ((declared, "declared key rule"), (record.key_mask, "key mask")):
        if mask is not None:
            eligible = eligible & as_4d(record.name, mask.to(weights.device), shape,
                                        what)[example]
    rows = weights[example][:, q_index].double()  # (H, Q', K): every key of the kept rows
    amap.eligible = _trim(eligible, q_index, k_index).cpu().numpy()
    amap.row_sum = rows.sum(-1).cpu().numpy()
    amap.masked_mass = rows.masked_fill(eligible[:, q_index], 0.0).sum(-1).cpu().numpy()
