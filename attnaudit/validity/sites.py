"""Per-site facts of a validity audit: the sites table, gathered batch after batch.

One row per attention site: site, kind, role, mechanism, module, layer, layout and how
capture determined it, heads, queries and keys (the largest seen), whether scores and
values were reachable, the key mask's shape as capture derived it (the mask's own dtype
is not kept by capture), the weights' dtype, the row-sum tolerance its rows were counted
at, the key rules used (:mod:`attnaudit.validity.rules`), whether capture had to
materialise its score matrix, and the mean weight a row put on sink columns (learned
logits normalised with the keys: ``AttentionRecord.sink``; 0 for a site without sinks).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from attnaudit.analysis import layer_of
from attnaudit.record import AttentionCall, AttentionRecord, Site
from attnaudit.validity.rules import CAPTURED_RULE, DECLARED_RULES

# Mechanisms whose score matrix exists only because capture computed it explicitly
# (the model would otherwise run a fused kernel that never materialises it).
MATERIALISED_BY_CAPTURE = ("sdpa", "mha")

SITE_COLUMNS = ["site", "kind", "role", "mechanism", "module", "layer", "layout", "layout_source",
                "heads", "queries", "keys", "scores_available", "values_available",
                "key_mask_shape", "weights_dtype", "row_sum_tolerance", "eligibility",
                "scores_materialised_by_capture", "sink_mass"]


@dataclass
class SitePass:
    """What one pass showed of a site, gathered call by call: the shape its calls stack to
    (heads, queries summed, the most keys), whether every call kept scores, the last
    call's values and dtype, the shape of the stacked key mask
    (:attr:`attnaudit.record.AttentionRecord.key_mask`), and the weight its rows put on
    sink columns (summed over its ``rows``)."""

    site: Site
    calls: int = 0
    heads: int = 0
    queries: int = 0
    keys: int = 0
    key_counts: set[int] = field(default_factory=set)
    scores: bool = True
    values: torch.Tensor | None = None
    dtype: torch.dtype | None = None
    mask_shapes: list[tuple[int, ...] | None] = field(default_factory=list)
    batch: int = 0
    sink_sum: float = 0.0
    rows: int = 0

    @classmethod
    def of(cls, record: AttentionRecord) -> SitePass:
        facts = cls(record.site)
        for call in record.calls:
            facts.add(call)
        return facts

    def add(self, call: AttentionCall) -> None:
        batch, self.heads, queries, keys = call.weights.shape
        self.calls, self.queries, self.batch = self.calls + 1, self.queries + queries, batch
        self.keys = max(self.keys, keys)
        self.key_counts.add(keys)
        self.rows += batch * self.heads * queries
        if call.sink is not None:
            self.sink_sum += float(call.sink.double().sum())
        self.scores &= call.scores is not None
        self.values, self.dtype = call.values, call.weights.dtype
        mask = call.key_mask
        if len(self.mask_shapes) < 2 or mask is not None:  # the rule needs no more
            self.mask_shapes.append(None if mask is None else tuple(mask.shape))

    @property
    def key_mask_shape(self) -> str:
        """The stacked key mask's shape, or ``none``: one call's own mask; none when no
        call has one and every call saw every key; else (B or 1, H or 1, queries, keys)."""
        shapes = self.mask_shapes
        if all(m is None for m in shapes) and len(self.key_counts) == 1:
            return "none"
        if self.calls == 1:
            return "none" if shapes[0] is None else str(shapes[0])
        lead_b = self.batch if any(m is not None and m[0] != 1 for m in shapes) else 1
        lead_h = self.heads if any(m is not None and m[1] != 1 for m in shapes) else 1
        return str((lead_b, lead_h, self.queries, self.keys))


@dataclass
class SiteFacts:
    """What the sites table says about one site, gathered over batches (batch numbers
    are the target's, from 0)."""

    record_site: Site
    heads: int = 0
    queries: int = 0
    keys: int = 0
    scores_available: bool = True
    values_available: bool = True
    key_mask_shape: str = ""
    weights_dtype: str = ""
    rules: set[str] = field(default_factory=set)
    roles: set[str] = field(default_factory=set)
    first_batch: int = -1
    last_batch: int = -1
    sink_sum: float = 0.0  # weight on sink columns, summed over rows
    rows: int = 0

    def update(self, seen: SitePass, role: str, batch: int) -> None:
        if self.first_batch < 0:
            self.first_batch = batch
        self.last_batch = batch
        self.heads, self.queries = seen.heads, max(self.queries, seen.queries)
        self.keys = max(self.keys, seen.keys)
        self.scores_available &= seen.scores
        self.values_available &= seen.values is not None
        self.key_mask_shape = seen.key_mask_shape
        self.weights_dtype = str(seen.dtype).removeprefix("torch.")
        self.roles.add(role)
        self.rules.add(DECLARED_RULES.get(role, CAPTURED_RULE))
        self.sink_sum, self.rows = self.sink_sum + seen.sink_sum, self.rows + seen.rows

    def merge(self, other: SiteFacts) -> None:
        """Fold in what another shard saw of the same site (its batches' facts); the
        facts kept from the last batch come from whichever saw the later batch."""
        later = other.last_batch > self.last_batch
        if later:
            self.heads, self.key_mask_shape = other.heads, other.key_mask_shape
            self.weights_dtype, self.last_batch = other.weights_dtype, other.last_batch
        self.queries, self.keys = max(self.queries, other.queries), max(self.keys, other.keys)
        self.scores_available &= other.scores_available
        self.values_available &= other.values_available
        self.roles |= other.roles
        self.rules |= other.rules
        self.sink_sum, self.rows = self.sink_sum + other.sink_sum, self.rows + other.rows
        self.first_batch = min(self.first_batch, other.first_batch)

    def row(self, row_sum_tolerance: float) -> dict[str, Any]:
        site = self.record_site
        return {
            "site": site.name, "kind": site.kind, "role": "/".join(sorted(self.roles)),
            "mechanism": site.mechanism, "module": site.module, "layer": layer_of(site.name),
            "layout": site.layout, "layout_source": site.layout_source,
            "heads": self.heads, "queries": self.queries, "keys": self.keys,
            "scores_available": self.scores_available,
            "values_available": self.values_available,
            "key_mask_shape": self.key_mask_shape,
            "weights_dtype": self.weights_dtype,
            "row_sum_tolerance": row_sum_tolerance,
            "eligibility": "; ".join(sorted(self.rules)),
            "scores_materialised_by_capture": site.mechanism in MATERIALISED_BY_CAPTURE,
            "sink_mass": self.sink_sum / self.rows if self.rows else 0.0,
        }


def merged_site_facts(per_rank: Sequence[Mapping[str, SiteFacts]]) -> dict[str, SiteFacts]:
    """Every rank's site facts merged, the sites in the order a single process meets them
    (by first batch, then by order within it)."""
    merged: dict[str, SiteFacts] = {}
    seen = [(facts.first_batch, at, name, facts) for rank_facts in per_rank
            for at, (name, facts) in enumerate(rank_facts.items())]
    for _, _, name, facts in sorted(seen, key=lambda item: item[:2]):
        if name in merged:
            merged[name].merge(facts)
        else:
            merged[name] = facts
    return merged


def sites_frame(sites: Mapping[str, SiteFacts], row_sum_tolerances: Mapping[str, float]
                ) -> pd.DataFrame:
    """The sites table (:data:`SITE_COLUMNS`), one row per site in ``sites``' order."""
    frame = pd.DataFrame([facts.row(row_sum_tolerances[name]) for name, facts in sites.items()],
                         columns=SITE_COLUMNS)
    frame["layer"] = frame["layer"].astype("Int64")
    return frame
