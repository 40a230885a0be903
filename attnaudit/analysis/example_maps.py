"""An audited example's attention at every site, trimmed to real tokens and labelled: what
the report's heatmaps and its attention explorer draw (and, per word,
:mod:`attnaudit.analysis.words`).

A map is gathered call by call (:class:`MapBuilder`: the streamed validity audit hands it
each attention call as it arrives) or from kept records (:func:`example_maps`), the same
code either way. Up to :data:`MAX_MAP_SIDE` query rows or keys a map is exact (the explorer
shows a moving window past 256 of them). A longer query axis is averaged in equal runs of
consecutive rows; a longer key axis (a long prompt) in blocks of a power-of-two number of
tokens (:mod:`attnaudit.analysis.long_keys`), each run or block labelled ``first…last``,
and each exact row of such a map keeps its top keys, its weight on key 0 and its sink
weight exactly (:attr:`AttentionMap.top_keys`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from attnaudit.analysis.base import as_4d
from attnaudit.analysis.long_keys import TopKeys, TopKeysBuilder, block_bins, block_size
from attnaudit.record import AttentionRecord, Family

START_LABEL = "<start>"  # the decoder's first input (a decoder-only model: the prompt's end)
MAX_MAP_SIDE = 512  # query rows or keys of a map; a longer axis is averaged in runs


@dataclass
class AttentionMap:
    """One site's weights for one example, trimmed to real tokens.

    weights: (heads, queries, keys) float32. Query and key labels name the tokens: a
    decoder query by the token its step emits, a decoder self-attention key by the input it
    holds (:data:`START_LABEL`, then the tokens emitted before), a source position by its
    token; a run of averaged positions (an axis past :data:`MAX_MAP_SIDE`) reads
    ``first…last``.
    eligible: bool (heads, queries, keys), the keys each row may attend (the declared rule
        AND the key mask capture saw), or None when not known. An averaged cell is eligible
        when any of its positions is.
    row_sum, masked_mass: float64 (heads, queries): each kept row's weight sum and its
        weight on ineligible keys, over *all* of the row's keys, trimmed ones included
        (weight on padding is masked mass even though its column is not drawn); None when
        not known. A run of averaged rows holds its worst row: the sum farthest from 1,
        the largest masked mass.
    measures: other per-cell measures on the same axes by name, each (heads or 1,
        queries, keys) float32 (value-norm contributions, attributions...); the explorer
        shows every one beside ``weights``.
    top_keys: where the key axis was cut into blocks and the rows are exact, each row's
        exact top keys, key-0 and sink weights on the token axis (None otherwise).
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
    top_keys: TopKeys | None = None


@dataclass
class ExampleMaps:
    """An audited example and its attention map at every site.

    words: per real source token (the maps' key axis of cross sites), its word index or -1;
    word_rule: how words were found (``offsets``, ``located`` or ``markers``; empty: not
    known, or the source axis was averaged). index: the example's position in the audited
    data. family: the audited target's family (None: a bare capture), which names its roles.
    """

    source: str
    source_tokens: list[str]
    target_tokens: list[str]
    maps: dict[str, AttentionMap]
    words: list[int] = field(default_factory=list)
    word_rule: str = ""
    index: int = 0
    family: Family | None = None


def example_maps(records: Mapping[str, AttentionRecord], roles: Mapping[str, str],
                 source: str, source_tokens: Sequence[object], target_tokens: Sequence[object],
                 source_mask: torch.Tensor, step_mask: torch.Tensor,
                 words: Sequence[int] = (), word_rule: str = "", *, example: int = 0,
                 declared: Mapping[str, torch.Tensor | None] | None = None,
                 index: int = 0) -> ExampleMaps:
    """Example ``example`` of kept ``records`` at every site, on its real source tokens and
    steps up to EOS (:class:`MapBuilder` fed each record whole).

    Args:
        records: site -> record; example ``example`` of each is drawn.
        roles: site -> cross, encoder_self, decoder_self or captured (captured sites keep
            every key and their first :data:`MAX_MAP_SIDE` queries, labelled by index).
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
    builder = MapBuilder(source_mask, step_mask, example=example,
                         validity=declared is not None)
    for name, record in records.items():
        builder.add(record, roles[name], 0, None if declared is None else declared.get(name))
    return builder.maps(source, source_tokens, target_tokens, words, word_rule, index=index)


@dataclass
class _SiteChecks:
    """A site's validity columns as gathered so far, on the axes of its map's weights.

    eligible: (H, rows, keys) float32, > 0 where a position of the cell is eligible.
    row_low, row_high, masked: float64 (H, rows), the least and greatest row sum and the
    greatest masked mass of each run.
    """

    eligible: torch.Tensor
    row_low: torch.Tensor
    row_high: torch.Tensor
    masked: torch.Tensor


@dataclass
class _SiteMap:
    """One site's map as gathered so far (see :class:`MapBuilder`).

    weights: (H, rows, keys) float32: declared roles hold sums over each run of rows (keys
    already averaged), captured sites their rows as they came. checks: its validity
    columns, None without validity. rows: captured sites' query rows kept so far; keys: the
    most keys a call had. top: a declared role's top keys per row, when its key axis is
    long and its rows exact (captured sites find theirs in :meth:`MapBuilder.maps`).
    """

    role: str
    weights: torch.Tensor
    checks: _SiteChecks | None
    rows: int = 0
    keys: int = 0
    top: TopKeysBuilder | None = None


class MapBuilder:
    """One example's maps gathered call by call (or record by record), trimmed to real
    tokens and, past :data:`MAX_MAP_SIDE` rows, averaged over equal runs of consecutive
    rows, past :data:`MAX_MAP_SIDE` keys over blocks of keys (beside each exact row's top
    keys, :mod:`attnaudit.analysis.long_keys`), so a map never holds more than
    ``heads x MAX_MAP_SIDE^2`` weights.

    source_mask: bool (n,), real source tokens. step_mask: bool (T,), steps up to EOS (both
    the example's). example: its row in the batches handed to :meth:`add`. validity: also
    gather each map's eligibility, row sums and masked mass, from every call's full rows
    before they are trimmed. Captured sites (no declared axes) keep their first
    :data:`MAX_MAP_SIDE` query rows, over every key until :meth:`maps` averages the keys.
    """

    def __init__(self, source_mask: torch.Tensor, step_mask: torch.Tensor, *,
                 example: int = 0, validity: bool = True) -> None:
        self.src = torch.nonzero(source_mask).squeeze(1).cpu()
        self.tgt = torch.nonzero(step_mask).squeeze(1).cpu()
        self.example = example
        self.validity = validity
        self.sites: dict[str, _SiteMap] = {}

    def _axes(self, role: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        return {"cross": (self.tgt, self.src), "encoder_self": (self.src, self.src),
                "decoder_self": (self.tgt, self.tgt)}.get(role)

    def add(self, record: AttentionRecord, role: str, offset: int,
            declared: torch.Tensor | None = None) -> None:
        """Fold in the example's weights of ``record`` (a call or a whole site), its query
        rows ``offset:offset + q`` of the site; ``declared``: the declared eligible keys of
        those rows (read by rank as in :func:`attnaudit.analysis.base.as_4d`; None: the
        captured key mask alone)."""
        weights = record.weights[self.example].detach()  # (H, q, K)
        axes = self._axes(role)
        if axes is not None and len(axes[1]) and int(axes[1][-1]) >= weights.shape[2]:
            return  # not this role's keys: a streamed call's role was inferred wrongly, and
            # its batch is analysed again from a kept capture
        eligible = self._eligible(record, declared) if self.validity else None
        if axes is None:
            self._add_captured(record.name, role, weights, eligible)
            return
        q_index, k_index = axes
        here = (q_index >= offset) & (q_index < offset + weights.shape[1])
        local = (q_index[here] - offset).to(weights.device)
        keys = k_index.to(weights.device)
        rows = weights[:, local]  # (H, q', K): every key of the kept rows
        bins = _bins(len(q_index))[torch.nonzero(here).squeeze(1)]
        site = self._site(record.name, role, rows.shape[0], len(q_index), len(k_index))
        mapped = rows[:, :, keys]  # (H, q', n keys)
        if site.top is not None:
            sink = record.sink
            site.top.add(mapped, bins, None if sink is None
                         else sink[self.example][:, local.to(sink.device)])
        site.weights.index_add_(1, bins, _pool(mapped.float().cpu(), 2, len(k_index)))
        checks = site.checks
        if eligible is not None and checks is not None:  # both or neither: self.validity
            mine = eligible[:, local]
            checks.eligible.index_add_(1, bins, _pool(mine[:, :, keys].float().cpu(), 2,
                                                      len(k_index)))
            row_sum, masked = _row_stats(rows, mine)
            index = bins.expand(row_sum.shape[0], -1)
            checks.row_low.scatter_reduce_(1, index, row_sum, "amin")
            checks.row_high.scatter_reduce_(1, index, row_sum, "amax")
            checks.masked.scatter_reduce_(1, index, masked, "amax")

    def _eligible(self, record: AttentionRecord, declared: torch.Tensor | None
                  ) -> torch.Tensor:
        """bool (H, q, K): the example's keys each row may attend (declared AND key mask)."""
        weights = record.weights
        shape = tuple(weights.shape)
        eligible = torch.ones(shape[1:], dtype=torch.bool, device=weights.device)
        for mask, what in ((declared, "declared key rule"), (record.key_mask, "key mask")):
            if mask is not None:
                eligible = eligible & as_4d(record.name, mask.to(weights.device), shape,
                                            what)[self.example]
        return eligible

    def _site(self, name: str, role: str, heads: int, rows: int, keys: int) -> _SiteMap:
        """The site's map, created empty (runs of ``rows`` rows by runs of ``keys`` keys)."""
        site = self.sites.get(name)
        if site is None:
            runs, key_runs = _runs(rows), _key_runs(keys)
            checks = _SiteChecks(
                torch.zeros(heads, runs, key_runs),
                *(torch.full((heads, runs), fill, dtype=torch.float64)
                  for fill in (torch.inf, -torch.inf, -torch.inf))) if self.validity else None
            site = self.sites[name] = _SiteMap(role, torch.zeros(heads, runs, key_runs),
                                               checks)
            if keys > MAX_MAP_SIDE and rows <= MAX_MAP_SIDE:
                site.top = TopKeysBuilder.empty(heads, rows, keys)
        return site

    def _add_captured(self, name: str, role: str, weights: torch.Tensor,
                      eligible: torch.Tensor | None) -> None:
        """A captured site: the call's rows up to :data:`MAX_MAP_SIDE` in all, every key."""
        site = self.sites.get(name)
        if site is None:
            empty = torch.zeros(weights.shape[0], 0, 0)
            rows = torch.zeros(weights.shape[0], 0, dtype=torch.float64)
            checks = _SiteChecks(empty.clone(), *(rows.clone() for _ in range(3))) \
                if self.validity else None
            site = self.sites[name] = _SiteMap(role, empty, checks)
        take = max(MAX_MAP_SIDE - site.rows, 0)
        rows = weights[:, :take]
        site.rows += rows.shape[1]
        keys = site.keys = max(site.keys, weights.shape[2])
        site.weights = _append_rows(site.weights, rows.float().cpu(), keys)
        checks = site.checks
        if eligible is not None and checks is not None:  # both or neither: self.validity
            mine = eligible[:, :take]
            checks.eligible = _append_rows(checks.eligible, mine.float().cpu(), keys)
            row_sum, masked = _row_stats(rows, mine)
            checks.row_low = torch.cat([checks.row_low, row_sum], dim=1)
            checks.row_high = torch.cat([checks.row_high, row_sum], dim=1)
            checks.masked = torch.cat([checks.masked, masked], dim=1)

    def maps(self, source: str, source_tokens: Sequence[object],
             target_tokens: Sequence[object], words: Sequence[int] = (),
             word_rule: str = "", *, index: int = 0, family: Family | None = None
             ) -> ExampleMaps:
        """The maps gathered, labelled (a run of averaged positions by its first and last
        token); ``words`` are dropped when the source axis was averaged; ``index``: the
        example's position in the audited data; ``family``: the target's."""
        src_labels = [str(source_tokens[i]) for i in self.src.tolist()]
        tgt_labels = [str(target_tokens[i]) for i in self.tgt.tolist()]
        # a decoder's step t reads its inputs: the start token, then the tokens emitted before t
        inputs = [START_LABEL, *tgt_labels[:-1]] if tgt_labels else []
        labels = {"cross": (tgt_labels, src_labels), "encoder_self": (src_labels, src_labels),
                  "decoder_self": (tgt_labels, inputs)}
        maps = {}
        for name, site in self.sites.items():
            checks = site.checks
            top = site.top
            if site.role in labels:
                q_labels, k_labels = labels[site.role]
                weights = site.weights / _counts(len(q_labels))[None, :, None]
                eligible = None if checks is None else checks.eligible
            else:
                if site.keys > MAX_MAP_SIDE:
                    top = TopKeysBuilder.empty(site.weights.shape[0], site.rows, site.keys)
                    top.add(site.weights, torch.arange(site.rows), None)
                weights = _pool(site.weights, 2, site.keys)
                eligible = None if checks is None else _pool(checks.eligible, 2, site.keys)
                q_labels = [str(i) for i in range(site.rows)]
                k_labels = [str(i) for i in range(site.keys)]
            amap = AttentionMap(name, site.role, weights.numpy(),
                                _pooled(q_labels, _bins(len(q_labels))),
                                _pooled(k_labels, _key_bins(len(k_labels))))
            if top is not None:
                amap.top_keys = top.keys(block_size(len(k_labels)), k_labels)
            if eligible is not None and checks is not None:  # eligible is None without checks
                amap.eligible = (eligible > 0).numpy()
                amap.row_sum = _worst_sum(checks.row_low, checks.row_high).numpy()
                amap.masked_mass = checks.masked.numpy()
            maps[name] = amap
        kept_words = [int(words[i]) for i in self.src.tolist()] if len(words) else []
        if len(kept_words) > MAX_MAP_SIDE:
            kept_words, word_rule = [], ""
        return ExampleMaps(source, src_labels, tgt_labels, maps, kept_words, word_rule, index,
                           family)


def _row_stats(rows: torch.Tensor, eligible: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(H, q, K) weights and eligibility -> float64 (H, q) row sums and masked mass, over
    every key of each row."""
    full = rows.double()
    return (full.sum(-1).cpu(), full.masked_fill(eligible, 0.0).sum(-1).cpu())


def _worst_sum(low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """Per run the row sum farthest from 1 (NaN when any row's is)."""
    worst = torch.where((low - 1.0).abs() > (high - 1.0).abs(), low, high)
    return torch.where(low.isnan() | high.isnan(), torch.nan, worst)


def _runs(length: int) -> int:
    """Runs of :func:`_bins` along an axis of ``length`` positions."""
    return min(MAX_MAP_SIDE, length)


def _bins(length: int) -> torch.Tensor:
    """(length,) long: each position's run when ``length`` positions are averaged into at
    most :data:`MAX_MAP_SIDE` runs of (nearly) equal size; the identity below that."""
    return torch.arange(length) * _runs(length) // max(length, 1)


def _counts(length: int) -> torch.Tensor:
    """(runs,) float32: positions per run of :func:`_bins`."""
    return torch.bincount(_bins(length), minlength=_runs(length)).float().clamp_min(1.0)


def _key_runs(length: int) -> int:
    """Cells of a key axis of ``length`` positions: the positions, or past
    :data:`MAX_MAP_SIDE` the blocks of :func:`~attnaudit.analysis.long_keys.block_size`."""
    return length if length <= MAX_MAP_SIDE else -(-length // block_size(length))


def _key_bins(length: int) -> torch.Tensor:
    """(length,) long: each key's cell (:func:`_key_runs`)."""
    return torch.arange(length) if length <= MAX_MAP_SIDE else block_bins(length)


def _pool(weights: torch.Tensor, axis: int, length: int) -> torch.Tensor:
    """``weights`` averaged over the cells of :func:`_key_bins` along the key ``axis`` (of
    ``length``)."""
    if length <= MAX_MAP_SIDE:
        return weights
    shape = list(weights.shape)
    shape[axis] = _key_runs(length)
    bins = _key_bins(length)
    pooled = torch.zeros(shape).index_add_(axis, bins, weights)
    counts = torch.bincount(bins, minlength=shape[axis]).float()
    return pooled / counts.reshape([-1 if a == axis else 1 for a in range(3)])


def _append_rows(kept: torch.Tensor, rows: torch.Tensor, keys: int) -> torch.Tensor:
    """(H, r, k) and (H, q, k') stacked on the row axis, right-padded with zeros (no weight,
    not eligible) to ``keys`` keys (a call that saw fewer)."""
    pad = torch.nn.functional.pad
    return torch.cat([pad(kept, (0, keys - kept.shape[2])),
                      pad(rows, (0, keys - rows.shape[2]))], dim=1)


def _pooled(labels: list[str], cells: torch.Tensor) -> list[str]:
    """Labels of the runs ``cells`` gives each position (:func:`_bins`, :func:`_key_bins`):
    a run of several positions reads ``first…last``."""
    if len(labels) <= MAX_MAP_SIDE:
        return labels
    bins = cells.tolist()
    firsts: dict[int, int] = {}
    lasts: dict[int, int] = {}
    for i, b in enumerate(bins):
        firsts.setdefault(b, i)
        lasts[b] = i
    return [labels[firsts[b]] if firsts[b] == lasts[b] else
            f"{labels[firsts[b]]}…{labels[lasts[b]]}" for b in sorted(firsts)]
