"""One batch's analysis: every attention call analysed as capture hands it over, or every
kept record at once; the audit's tables come out the same either way.

Streaming (``capture(on_call=..., keep=False)``): a call is analysed under the role its site
will have once the pass ends (:mod:`attnaudit.validity.rules` decides a role from the
site's stacked shape). The role is inferred from the call: from the first of these stacked
query counts that holds the call's rows and gives a declared role: the call's own (a site's
first call), the key count (self-attention), ``n_target``, ``n_source``.
At the end of the pass :meth:`BatchAnalysis.verified` checks every inference
against the stacked shapes; a batch that fails (a site whose calls do not add up to the
shape inferred, calls with different key counts, values that differ between calls) is
analysed again from a kept capture, so no table ever depends on a wrong inference. The
analysers and region analysers are this batch's own, merged into the audit's when it is
done, in both modes, so both sum in the same order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import torch

from attnaudit.analysis import AttentionRows, RegionAnalyser, mean_over_heads
from attnaudit.analysis.example_maps import MapBuilder
from attnaudit.record import AttentionCall, AttentionRecord, Role, Site
from attnaudit.targets.checks import call_target
from attnaudit.targets.contract import Batch, Seq2SeqTarget
from attnaudit.validity.analysers import ValidityAnalysers, same_tensor
from attnaudit.validity.rules import (
    declared_rows,
    declared_rule,
    roles_of_shapes,
    rows_of,
    site_role,
    site_roles,
)
from attnaudit.validity.sites import SitePass


@dataclass
class BatchAnalysis:
    """One batch's analysers, region analysers, per-site pass facts and the map builders
    of its examples whose maps are kept (its first rows, while the audit keeps fewer than
    it was asked to).

    ``emitted``: (B, T) the audited output; ``step_mask``: bool (B, T), steps up to EOS.
    """

    target: Seq2SeqTarget
    batch: Batch
    emitted: torch.Tensor
    step_mask: torch.Tensor
    analysers: ValidityAnalysers
    regions: dict[str, RegionAnalyser]
    maps: list[MapBuilder] = field(default_factory=list)
    passes: dict[str, SitePass] = field(default_factory=dict)
    roles: dict[str, Role] = field(default_factory=dict)
    largest_call_bytes: int = 0
    _guessed: dict[str, set[str]] = field(default_factory=dict)
    _first_values: dict[str, torch.Tensor | None] = field(default_factory=dict)
    _values_shared: dict[str, bool] = field(default_factory=dict)
    _expected: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def n_source(self) -> int:
        return self.batch.source_ids.shape[1]

    @property
    def n_target(self) -> int:
        return self.emitted.shape[1]

    def on_call(self, site: Site, call: AttentionCall) -> None:
        """Analyse one call (``capture(on_call=...)``); nothing of it is kept but the kept
        examples' map rows and, where values were kept, the first call's values."""
        offset = site.query_offset
        site = replace(site, call=0, query_offset=0)
        facts = self.passes.setdefault(site.name, SitePass(site))
        facts.add(call)
        _, _, queries, keys = call.weights.shape
        role = self._infer_role(site, offset, queries, keys)
        self._guessed.setdefault(site.name, set()).add(role)
        self.roles.setdefault(site.name, role)
        first = self._first_values.setdefault(site.name, call.values)
        shared = (first is None and call.values is None) or (
            first is not None and same_tensor(call.values, first))
        self._values_shared[site.name] = self._values_shared.get(site.name, True) and shared
        unit = AttentionRecord(site)
        unit.append(call)
        self.largest_call_bytes = max(self.largest_call_bytes, _call_bytes(call))
        self._analyse(unit, role, offset)

    def add_records(self, records: Mapping[str, AttentionRecord]) -> None:
        """Analyse a kept capture's records, each under its role."""
        self.roles = site_roles(records, self.n_source, self.n_target)
        for name, record in records.items():
            self.passes[name] = SitePass.of(record)
            self._analyse(record, self.roles[name], 0)

    def verified(self) -> bool:
        """Every role inferred call by call is the role of the site's stacked shape, every
        call of a site saw the same keys, and values read per call are the record's."""
        final = roles_of_shapes({n: (p.site, p.queries, p.keys)
                                 for n, p in self.passes.items()}, self.n_source, self.n_target)
        return all(self._guessed[name] == {final[name]} and len(p.key_counts) == 1
                   and self._values_shared[name] for name, p in self.passes.items())

    def _infer_role(self, site: Site, offset: int, queries: int, keys: int) -> Role:
        """The role the site's stacked shape will give (see the module docstring)."""
        stacked = (([queries] if offset == 0 else []) + ([keys] if site.kind == "self" else [])
                   + [self.n_target, self.n_source])
        for total in stacked:
            if offset + queries <= total:
                role = site_role(site, total, keys, self.n_source, self.n_target)
                if role != Role.CAPTURED:
                    return role
        return Role.CAPTURED

    def _analyse(self, record: AttentionRecord, role: str, offset: int) -> None:
        """Feed the analysers (and regions, and the kept examples' maps) query rows
        ``offset:offset + Q`` of the site's stacked record."""
        stop = offset + record.weights.shape[2]
        declared, rows = rows_of(*declared_rule(role, self.batch, self.step_mask), role,
                                 offset, stop)
        self.analysers.update(record, eligible=declared, rows=rows, step_offset=offset)
        if role == Role.CROSS and self.regions:
            data = replace(declared_rows(record, declared), step_offset=offset)
            self._update_regions(data, offset, stop)
        for builder in self.maps:
            builder.add(record, role, offset, declared)

    def _update_regions(self, data: AttentionRows, start: int, stop: int) -> None:
        """Each expectation's region analyser, fed rows ``start:stop`` per head and averaged
        over heads."""
        for expectation in self.target.expectations:
            analyser = self.regions.get(expectation.name)
            if analyser is None:
                continue
            expected = self._expected.get(expectation.name)
            if expected is None:
                expected = self._expected[expectation.name] = call_target(
                    self.target.name, f"expectation {expectation.name!r}", expectation.keys,
                    self.batch, self.emitted)
            if expected.ndim >= 3:  # per query row: (B, Q, K) or (B, H, Q, K)
                expected = expected[..., start:stop, :]
            rows = self.step_mask.clone()
            if expectation.rows is not None:
                rows[:, expectation.rows:] = False
            rows = rows[:, start:stop]
            analyser.update(data, expected=expected, rows=rows)
            analyser.update(mean_over_heads(data), expected=expected, rows=rows)


def _call_bytes(call: AttentionCall) -> int:
    """Bytes of the tensors capture handed over in ``call`` (weights, scores, values)."""
    return sum(t.numel() * t.element_size()
               for t in (call.weights, call.scores, call.values) if t is not None)
