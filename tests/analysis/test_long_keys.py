"""A long key axis's kept keys, gathered call by call in bfloat16: each exact row's top keys,
key-0 and sink-column weights against numpy on the rows as they came, on real tokens only
(padding keys trimmed), equal whether the rows arrive in one call or one by one."""

from __future__ import annotations

import itertools

import numpy as np
import torch

from attnaudit.analysis.example_maps import MapBuilder
from attnaudit.analysis.long_keys import block_size
from attnaudit.record import AttentionCall, AttentionRecord, Site
from tests.helpers.map_runs import key_pooled


def _maps(weights: torch.Tensor, sink: torch.Tensor, source_mask: torch.Tensor,
          cuts: list[int]):
    steps = weights.shape[2]
    builder = MapBuilder(source_mask, torch.ones(steps, dtype=torch.bool), example=1)
    for start, stop in itertools.pairwise(cuts):
        record = AttentionRecord(Site("x", "cross", "softmax", "x"))
        record.append(AttentionCall(weights[:, :, start:stop],
                                    sink=sink[:, :, start:stop]))
        builder.add(record, "cross", start, None)
    return builder.maps("", [f"t{i}" for i in range(len(source_mask))],
                        [f"s{i}" for i in range(steps)]).maps["x"]


def test_each_row_keeps_its_top_keys_key_0_and_sink_over_real_tokens():
    torch.manual_seed(6)
    n, real, steps = 3000, 2990, 5
    scores = 4 * torch.randn(2, 3, steps, n + 1)
    full = torch.softmax(scores, -1)  # the last column is a sink column, no key
    weights, sink = full[..., :n].to(torch.bfloat16), full[..., n:].to(torch.bfloat16)
    source_mask = torch.arange(n) < real
    whole = _maps(weights, sink, source_mask, [0, steps])
    streamed = _maps(weights, sink, source_mask, list(range(steps + 1)))

    w = weights[1, :, :, :real].double().numpy()  # (H, steps, real tokens)
    top = whole.top_keys
    assert top is not None and top.sink is not None
    assert top.block == block_size(real) == 32 and len(top.tokens) == real
    np.testing.assert_array_equal(top.value, -np.sort(-w, -1)[..., :8])
    np.testing.assert_array_equal(top.value, np.take_along_axis(w, top.index, -1))
    np.testing.assert_array_equal(top.first, w[..., 0])
    np.testing.assert_array_equal(top.sink, sink[1, :, :, 0].double().numpy())
    np.testing.assert_allclose(whole.weights, key_pooled(w, 2, real), rtol=1e-6)
    again = streamed.top_keys
    assert again is not None
    for field in ("index", "value", "first", "sink"):
        np.testing.assert_array_equal(getattr(again, field), getattr(top, field), field)
