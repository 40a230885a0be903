"""The sites table shows how much weight a site's rows put on sink columns: the mean over
every recorded row of every batch (and shard), 0 for a site without sinks."""

from __future__ import annotations

import torch

from attnaudit.record import AttentionCall, AttentionRecord, Site
from attnaudit.validity.sites import SiteFacts

SITE = Site(name="layer:self", kind="self", mechanism="softmax", module="layer")


def record(sink: list[float] | None, rows: int) -> AttentionRecord:
    rec = AttentionRecord(SITE)
    weights = torch.full((1, 1, rows, 2), 0.25)
    rec.append(AttentionCall(weights=weights, sink=None if sink is None
                             else torch.tensor(sink).reshape(1, 1, rows, 1)))
    return rec


def test_sink_mass_is_the_mean_row_weight_on_sinks_over_batches_and_shards():
    first, second = SiteFacts(SITE), SiteFacts(SITE)
    first.update(record([0.5, 0.1, 0.3], 3), "captured", 0)
    second.update(record([0.9], 1), "captured", 1)
    first.merge(second)
    assert abs(first.row(1e-3)["sink_mass"] - (0.5 + 0.1 + 0.3 + 0.9) / 4) < 1e-7  # float32 sinks
    none = SiteFacts(SITE)
    none.update(record(None, 2), "captured", 0)
    assert none.row(1e-3)["sink_mass"] == 0.0
