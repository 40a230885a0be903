"""Sinks in the validity audit: the sites table shows how much weight a site's rows put on
sink columns (the mean over every recorded row of every batch and shard, 0 for a site
without sinks), and the row-sum check counts the sink in every row group and head mean."""

from __future__ import annotations

import torch

from attnaudit.analysis.numerics import NumericsAnalyser
from attnaudit.analysis.regions import mean_over_heads
from attnaudit.record import AttentionCall, AttentionRecord, Site
from attnaudit.validity.analysers import ValidityAnalysers
from attnaudit.validity.sites import SiteFacts, SitePass

SITE = Site(name="layer:self", kind="self", mechanism="softmax", module="layer")


def one_pass(sink: list[float] | None, rows: int) -> SitePass:
    """What a pass with one call of ``rows`` query rows and these sink weights showed."""
    rec = AttentionRecord(SITE)
    weights = torch.full((1, 1, rows, 2), 0.25)
    rec.append(AttentionCall(weights=weights, sink=None if sink is None
                             else torch.tensor(sink).reshape(1, 1, rows, 1)))
    return SitePass.of(rec)


def test_sink_mass_is_the_mean_row_weight_on_sinks_over_batches_and_shards():
    first, second = SiteFacts(SITE), SiteFacts(SITE)
    first.update(one_pass([0.5, 0.1, 0.3], 3), "captured", 0)
    second.update(one_pass([0.9], 1), "captured", 1)
    first.merge(second)
    assert abs(first.row(1e-3)["sink_mass"] - (0.5 + 0.1 + 0.3 + 0.9) / 4) < 1e-7  # float32 sinks
    none = SiteFacts(SITE)
    none.update(one_pass(None, 2), "captured", 0)
    assert none.row(1e-3)["sink_mass"] == 0.0


def test_rows_with_sinks_pass_the_row_sum_check_per_row_group_and_head_mean():
    """Keys 0.6 + 0.1 and a sink of 0.3 (0.25 + 0.25 and 0.5 in the other head): rows sum to
    one with their sink, in every row group the validity audit cuts and in the head mean."""
    rec = AttentionRecord(SITE)
    weights = torch.tensor([[0.6, 0.1], [0.25, 0.25]]).reshape(1, 2, 1, 2).expand(2, 2, 3, 2)
    sink = torch.tensor([0.3, 0.5]).reshape(1, 2, 1, 1).expand(2, 2, 3, 1)
    rec.append(AttentionCall(weights=weights.clone(), sink=sink.clone()))
    analysers = ValidityAnalysers(checks_only=True)
    rows = torch.tensor([[True, True, False], [True, False, False]])  # two row groups
    analysers.update(rec, rows=rows)
    [numerics] = [a for a in analysers.row_analysers if isinstance(a, NumericsAnalyser)]
    numerics.update(mean_over_heads(rec))
    table = numerics.compute()
    row_sums = table[table.metric == "row_sum_rows"]
    assert set(row_sums.site) == {"layer:self", "layer:self:head_mean"}
    assert row_sums["sum"].sum() == 0 and row_sums["n"].sum() == 3 * 2 + 2 * 3
