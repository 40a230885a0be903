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


MAX_MAP_SIDE = 512  # query rows or keys of a map; a longer axis is averaged in runs


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
    builder = MapBuilder(source_mask, step_mask)
    for name, record in records.items():
        builder.add(name, roles[name], record.weights[0], 0)
    return builder.maps(source, source_tokens, target_tokens, words, word_rule)


class MapBuilder:
    """Example 0's maps gathered call by call (or record by record), trimmed to real tokens
    and, past :data:`MAX_MAP_SIDE` rows or keys, averaged over equal runs of consecutive
    positions, so a map never holds more than ``heads x MAX_MAP_SIDE^2`` weights.

    source_mask: bool (n,), real source tokens. step_mask: bool (T,), steps up to EOS.
    Captured sites (no declared axes) keep their first :data:`MAX_MAP_SIDE` query rows,
    over every key until :meth:`maps` averages the keys.
    """

    def __init__(self, source_mask: torch.Tensor, step_mask: torch.Tensor) -> None:
        self.src = torch.nonzero(source_mask).squeeze(1)
        self.tgt = torch.nonzero(step_mask).squeeze(1)
        self.roles: dict[str, str] = {}
        self.sums: dict[str, torch.Tensor] = {}  # site -> (H, rows, keys) float32, pooled
        self.rows: dict[str, int] = {}  # captured sites: query rows kept so far
        self.keys: dict[str, int] = {}  # captured sites: the most keys a call had

    def _axes(self, role: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        return {"cross": (self.tgt, self.src), "encoder_self": (self.src, self.src),
                "decoder_self": (self.tgt, self.tgt)}.get(role)

    def add(self, name: str, role: str, weights: torch.Tensor, offset: int) -> None:
        """Fold in example 0's weights (H, q, K) of the query rows ``offset:offset + q``."""
        self.roles.setdefault(name, role)
        weights = weights.detach()
        axes = self._axes(role)
        if axes is None:
            kept = self.rows.get(name, 0)
            keys = self.keys[name] = max(self.keys.get(name, 0), weights.shape[2])
            part = weights[:, :max(MAX_MAP_SIDE - kept, 0)].float().cpu()
            self.rows[name] = kept + part.shape[1]
            old = self.sums.get(name)
            self.sums[name] = part if old is None else torch.cat(
                [_pad_keys(old, keys), _pad_keys(part, keys)], dim=1)
            return
        q_index, k_index = axes
        if len(k_index) and int(k_index[-1]) >= weights.shape[2]:
            return  # not this role's keys: a streamed call's role was inferred wrongly, and
            # its batch is analysed again from a kept capture
        here = (q_index >= offset) & (q_index < offset + weights.shape[1])
        local = (q_index[here] - offset).to(weights.device)
        part = weights[:, local][:, :, k_index.to(weights.device)].float().cpu()
        bins = _bins(len(q_index))[torch.nonzero(here).squeeze(1)]
        part = _pool(part, 2, len(k_index))
        sums = self.sums.get(name)
        if sums is None:
            sums = self.sums[name] = torch.zeros(part.shape[0], int(_bins(len(q_index))[-1]) + 1
                                                 if len(q_index) else 0, part.shape[2])
        sums.index_add_(1, bins, part)

    def maps(self, source: str, source_tokens: Sequence[object],
             target_tokens: Sequence[object], words: Sequence[int] = (),
             word_rule: str = "") -> ExampleMaps:
        """The maps gathered, labelled (a run of averaged positions by its first and last
        token); ``words`` are dropped when the source axis was averaged."""
        src_labels = [str(source_tokens[i]) for i in self.src.tolist()]
        tgt_labels = [str(target_tokens[i]) for i in self.tgt.tolist()]
        labels = {"cross": (tgt_labels, src_labels), "encoder_self": (src_labels, src_labels),
                  "decoder_self": (tgt_labels, tgt_labels)}
        maps = {}
        for name, sums in self.sums.items():
            role = self.roles[name]
            if role in labels:
                q_labels, k_labels = labels[role]
                sums = sums / _counts(len(q_labels))[None, :, None]
            else:
                sums = _pool(sums, 2, sums.shape[2])
                q_labels = [str(i) for i in range(self.rows[name])]
                k_labels = [str(i) for i in range(self.keys[name])]
            maps[name] = AttentionMap(name, role, sums.numpy(), _pooled(q_labels),
                                      _pooled(k_labels))
        kept_words = [int(words[i]) for i in self.src.tolist()] if len(words) else []
        if len(kept_words) > MAX_MAP_SIDE:
            kept_words, word_rule = [], ""
        return ExampleMaps(source, src_labels, tgt_labels, maps, kept_words, word_rule)


def _bins(length: int) -> torch.Tensor:
    """(length,) long: each position's run when ``length`` positions are averaged into at
    most :data:`MAX_MAP_SIDE` runs of (nearly) equal size; the identity below that."""
    return torch.arange(length) * min(MAX_MAP_SIDE, length) // max(length, 1)


def _counts(length: int) -> torch.Tensor:
    """(runs,) float32: positions per run of :func:`_bins`."""
    return torch.bincount(_bins(length)).float().clamp_min(1.0)


def _pool(weights: torch.Tensor, axis: int, length: int) -> torch.Tensor:
    """``weights`` averaged over the runs of :func:`_bins` along ``axis`` (of ``length``)."""
    if length <= MAX_MAP_SIDE:
        return weights
    bins = _bins(length)
    shape = list(weights.shape)
    shape[axis] = int(bins[-1]) + 1
    pooled = torch.zeros(shape).index_add_(axis, bins, weights)
    return pooled / _counts(length).reshape([-1 if a == axis else 1 for a in range(3)])


def _pad_keys(weights: torch.Tensor, keys: int) -> torch.Tensor:
    """(H, q, k) right-padded with zero weight to ``keys`` keys (a call that saw fewer)."""
    return torch.nn.functional.pad(weights, (0, keys - weights.shape[2]))


def _pooled(labels: list[str]) -> list[str]:
    """Labels of :func:`_bins`' runs: a run of several positions reads ``first…last``."""
    if len(labels) <= MAX_MAP_SIDE:
        return labels
    bins = _bins(len(labels)).tolist()
    firsts: dict[int, int] = {}
    lasts: dict[int, int] = {}
    for i, b in enumerate(bins):
        firsts.setdefault(b, i)
        lasts[b] = i
    return [labels[firsts[b]] if firsts[b] == lasts[b] else
            f"{labels[firsts[b]]}…{labels[lasts[b]]}" for b in sorted(firsts)]
