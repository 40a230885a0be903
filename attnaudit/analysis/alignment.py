"""Attention as word alignment, scored against gold links (docs/metrics.md, "Where the mass goes").

Per example and head, subword weights (queries = target rows, keys = source tokens) become
a word matrix: sum over a source word's subword keys, average over a target word's subword
rows. Rows whose target word id is None (special tokens, EOS) are dropped, and so are keys
whose source word id is None (special tokens, EOS, padding): each target word links to the
argmax source word among real words only (as fairseq's ``extract_hard_alignment`` does;
ties go to the lowest source word id). That gives A, one link per target word.

Corpus-level counts are summed over examples and merged across shards:
    precision = |A and P| / |A|          recall = |A and S| / |S|
    AER       = 1 - (|A and S| + |A and P|) / (|A| + |S|)
with S within P (Och & Ney 2003). Links are (source word i, target word j), as in Pharaoh
``i-j``. A metric whose denominator is 0 is omitted from :meth:`AlignmentAnalyser.compute`
(never NaN).

Heads: one row per head ``0..H-1`` from each head's own weights, plus ``head = -1`` from
the weights averaged over heads (for single-head sites it equals head 0).

Non-finite weights: an example whose used rows (target word rows, source word keys) hold
a non-finite weight in a head contributes nothing to that head (neither A nor S), so every
head's AER is over the examples it could score; ``n`` is that example count.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from numbers import Integral
from typing import NoReturn, Self

import numpy as np
import pandas as pd
import torch

from attnaudit.analysis.base import Analyser, AttentionRows
from attnaudit.analysis.stats import layer_of
from attnaudit.errors import AnalysisError
from attnaudit.record import AttentionRecord

Link = tuple[int, int]
Gold = tuple[Collection[Link], Collection[Link]] | set[Link] | frozenset[Link]
WordIds = Sequence[int | None]

MEAN_HEAD = -1
# count columns of the per-site state, in order
COUNTS = ("n", "a_and_s", "a_and_p", "a", "s")


@dataclass
class _SiteCounts:
    kind: str | None
    counts: np.ndarray = field(repr=False)  # (heads + 1, len(COUNTS)); last row = head mean


def _sure_possible(gold: Gold) -> tuple[set[Link], set[Link]]:
    """(sure, possible) with possible including sure; a bare set means sure = possible."""
    if isinstance(gold, (set, frozenset)):
        sure = possible = {(int(i), int(j)) for i, j in gold}
    else:
        try:
            first, second = gold
        except (TypeError, ValueError):
            raise AnalysisError(f"gold {gold!r} is neither a (sure, possible) pair of link "
                                "sets nor a set of links") from None
        sure = {(int(i), int(j)) for i, j in first}
        possible = {(int(i), int(j)) for i, j in second}
    return sure, possible | sure


def _word_map(ids: WordIds, length: int, what: str, site: str, b: int
              ) -> tuple[list[int], torch.Tensor]:
    """Sorted distinct word ids and the (n_words, length) membership matrix in float64."""
    if len(ids) > length:
        raise AnalysisError(f"site {site!r}, example {b}: {len(ids)} {what} word ids for an axis "
                            f"of length {length}")
    for w in ids:
        if w is not None and (isinstance(w, bool) or not isinstance(w, Integral) or w < 0):
            raise AnalysisError(f"site {site!r}, example {b}: {what} word id {w!r} is not a "
                                "non-negative int or None")
    words = sorted({int(w) for w in ids if w is not None})
    column = {w: c for c, w in enumerate(words)}
    member = torch.zeros(len(words), length, dtype=torch.float64)
    for pos, w in enumerate(ids):
        if w is not None:
            member[column[int(w)], pos] = 1.0
    return words, member


class AlignmentAnalyser(Analyser):
    """Corpus-level AER, precision and recall of argmax links, per site x head.

    ``strict`` (default True): a gold link naming a source or target word that no key or
    row carries raises ValueError (usually 1-based indices, or examples out of order).
    With ``strict=False`` such links still count in |S| (and P) as misses.
    """

    def __init__(self, strict: bool = True) -> None:
        super().__init__()
        self.strict = strict
        self.sites: dict[str, _SiteCounts] = {}

    def update(self, record: AttentionRecord | AttentionRows, *,  # type: ignore[override]
               gold: Sequence[Gold], src_word_ids: Sequence[WordIds],
               tgt_word_ids: Sequence[WordIds]) -> None:
        """Fold one batch in.

        Args:
            record: cross-attention record (or AttentionRows); weights (B, H, Q, K), Q = target
                rows (teacher-forced on the gold target), K = source tokens.
            gold: per example ``(sure, possible)`` link sets of (source i, target j), as from
                :func:`~attnaudit.analysis.expectations.read_pharaoh`; a bare ``set`` /
                ``frozenset`` of links means sure = possible.
            src_word_ids: per example, the source word id of each key (length <= K; None for
                special tokens; keys past the end count as None), e.g. a Hugging Face fast
                tokenizer's ``encoding.word_ids()``.
            tgt_word_ids: per example, the target word id of each query row (length <= Q;
                None for special tokens and EOS rows, which are dropped).
        """
        data = AttentionRows.of(record)
        batch, heads = data.weights.shape[:2]
        lengths = {len(gold), len(src_word_ids), len(tgt_word_ids)}
        if lengths != {batch}:
            raise AnalysisError(
                f"site {data.site!r}: weights of shape {tuple(data.weights.shape)} have batch "
                f"{batch}, but gold/src_word_ids/tgt_word_ids have {len(gold)}/"
                f"{len(src_word_ids)}/{len(tgt_word_ids)} examples")
        state = self.sites.get(data.site)
        if state is None:
            state = _SiteCounts(data.kind, np.zeros((heads + 1, len(COUNTS))))
        elif state.counts.shape[0] != heads + 1:
            raise AnalysisError(f"site {data.site!r} had {state.counts.shape[0] - 1} heads, "
                                f"now {heads}")
        weights = torch.cat([data.weights, data.weights.mean(1, keepdim=True)], dim=1)
        total = np.zeros_like(state.counts)  # all examples first: an error leaves no trace
        for b in range(batch):
            total += self._example(data.site, b, weights[b], gold[b], src_word_ids[b],
                                   tgt_word_ids[b])
        state.counts += total
        self.sites[data.site] = state

    def _example(self, site: str, b: int, weights: torch.Tensor, gold: Gold,
                 src_ids: WordIds, tgt_ids: WordIds) -> np.ndarray:
        """Counts (H + 1, len(COUNTS)) for one example; weights (H + 1, Q, K)."""
        n_heads, queries, keys = weights.shape
        src_words, src_member = _word_map(src_ids, keys, "source", site, b)
        tgt_words, tgt_member = _word_map(tgt_ids, queries, "target", site, b)
        sure, possible = _sure_possible(gold)
        if self.strict:
            src_set, tgt_set = set(src_words), set(tgt_words)
            stray = sorted(link for link in possible
                           if link[0] not in src_set or link[1] not in tgt_set)
            if stray:
                raise AnalysisError(
                    f"site {site!r}, example {b}: gold links {stray[:5]} name words absent "
                    f"from the word ids (source words {src_words[:10]}, target words "
                    f"{tgt_words[:10]}); check 0-based indices and example order, or pass "
                    "strict=False")
        out = np.zeros((n_heads, len(COUNTS)))
        used_rows = tgt_member.sum(0) > 0
        used_keys = src_member.sum(0) > 0
        finite = torch.isfinite(weights[:, used_rows][:, :, used_keys]).flatten(1).all(1)
        out[:, 0] = finite.numpy()
        out[:, 4] = np.where(finite.numpy(), len(sure), 0)
        if not src_words or not tgt_words:
            return out
        safe = torch.where(torch.isfinite(weights), weights, 0.0)
        # (H+1, J, Q) @ (Q, K) @ (K, I): average over target subwords, sum over source ones
        rows_avg = tgt_member / tgt_member.sum(1, keepdim=True)
        word = rows_avg @ safe @ src_member.T  # (H+1, J, I)
        best = word.argmax(-1)  # (H+1, J): first maximum = lowest source word id
        for h in range(n_heads):
            if not finite[h]:
                continue
            links = {(src_words[i], tgt_words[j]) for j, i in enumerate(best[h].tolist())}
            out[h, 1:4] = (len(links & sure), len(links & possible), len(links))
        return out

    def rows_metrics(self, rows: AttentionRows) -> NoReturn:
        raise TypeError("AlignmentAnalyser needs gold links: call update(record, gold=..., "
                        "src_word_ids=..., tgt_word_ids=...)")

    def counts(self) -> pd.DataFrame:
        """Raw summed counts: site, kind, layer, head, n, a_and_s, a_and_p, a, s."""
        rows = []
        for site, state in self.sites.items():
            n_heads = state.counts.shape[0] - 1
            for index, values in enumerate(state.counts):
                head = MEAN_HEAD if index == n_heads else index
                row = {"site": site, "kind": state.kind, "layer": layer_of(site), "head": head}
                row.update({name: int(v) for name, v in zip(COUNTS, values, strict=True)})
                rows.append(row)
        frame = pd.DataFrame(rows, columns=["site", "kind", "layer", "head", *COUNTS])
        frame["layer"] = frame["layer"].astype("Int64")
        return frame.sort_values(["site", "head"], ignore_index=True)

    def compute(self) -> pd.DataFrame:
        """Tidy frame: site, kind, layer, head, metric (aer/precision/recall), value,
        n_links (the metric's denominator: |A| + |S|, |A| or |S|), n (examples scored).

        head = -1 is the head-averaged weights. Rows with a zero denominator are omitted.
        """
        rows = []
        for c in self.counts().to_dict("records"):
            ratios = {
                "aer": (c["a_and_s"] + c["a_and_p"], c["a"] + c["s"]),
                "precision": (c["a_and_p"], c["a"]),
                "recall": (c["a_and_s"], c["s"]),
            }
            for metric, (num, den) in ratios.items():
                if den == 0:
                    continue
                value = 1.0 - num / den if metric == "aer" else num / den
                rows.append({"site": c["site"], "kind": c["kind"], "layer": c["layer"],
                             "head": c["head"], "metric": metric, "value": value,
                             "n_links": den, "n": c["n"]})
        columns = ["site", "kind", "layer", "head", "metric", "value", "n_links", "n"]
        frame = pd.DataFrame(rows, columns=columns)
        frame["layer"] = frame["layer"].astype("Int64")
        return frame.sort_values(["site", "metric", "head"], ignore_index=True)

    def merge(self, other: Self) -> Self:
        if type(other) is not type(self):
            raise TypeError(f"cannot merge {type(other).__name__} into {type(self).__name__}")
        for site, theirs in other.sites.items():
            mine = self.sites.get(site)
            if mine is None:
                self.sites[site] = _SiteCounts(theirs.kind, theirs.counts.copy())
            elif mine.counts.shape != theirs.counts.shape:
                raise AnalysisError(f"site {site!r}: cannot merge {mine.counts.shape[0] - 1} heads "
                                    f"with {theirs.counts.shape[0] - 1}")
            else:
                mine.counts += theirs.counts
        return self

    def reset(self) -> None:
        self.sites.clear()
        super().reset()
