"""Example maps at and past the size limit (512 positions per axis), against numpy.

- Rows that arrive over several calls, past the limit: a decoder site's 1100 steps in calls
  of uneven sizes, so runs of averaged rows straddle calls; a captured site (no declared
  axes) whose calls together bring more rows than a map keeps, with keys that grow call by
  call.
- An axis of exactly the limit is exact (no run, every label its own, the words kept); one
  more position averages it.

The reference runs (tests/helpers/map_runs.py) are written from their definition, not from
the code's formula.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch

from attnaudit.analysis.example_maps import MAX_MAP_SIDE, MapBuilder, example_maps
from attnaudit.record import AttentionCall, AttentionRecord, Site
from tests.helpers.map_runs import key_pooled, key_runs, pooled, runs


def _call(name: str, kind: str, weights: torch.Tensor,
          mask: torch.Tensor | None = None) -> AttentionRecord:
    record = AttentionRecord(Site(name, kind, "softmax", name))
    record.append(AttentionCall(weights, mask_source=None if mask is None else (lambda: mask)))
    return record


def test_a_long_decoder_axis_arriving_over_uneven_calls_is_averaged_as_a_whole():
    torch.manual_seed(2)
    steps, n = 1100, 40
    # rows summing to 0.5..1.5, so each run's sum farthest from 1 is one row's, not a tie
    weights = torch.softmax(torch.randn(1, 2, steps, n), -1) * (0.5 + torch.rand(1, 2, steps, 1))
    declared = torch.ones(steps, n, dtype=torch.bool)
    declared[:, n - 9:] = False  # the last keys are not eligible: weight there is masked
    step_mask = torch.ones(steps, dtype=torch.bool)
    source_mask = torch.ones(n, dtype=torch.bool)
    cuts = [0, 1, 4, 11, 93, 94, 333, 334, 335, 800, 801, 1099, steps]
    builder = MapBuilder(source_mask, step_mask)
    for start, stop in itertools.pairwise(cuts):
        builder.add(_call("x", "cross", weights[:, :, start:stop]), "cross", start,
                    declared[None, None, start:stop])
    got = builder.maps("", [f"s{i}" for i in range(n)],
                       [f"t{i}" for i in range(steps)]).maps["x"]

    assert got.row_sum is not None and got.masked_mass is not None and got.eligible is not None
    w = weights[0].double().numpy()  # (H, steps, n)
    eligible = declared.numpy()
    steps_runs = runs(steps)
    assert math.ceil(steps / MAX_MAP_SIDE) == 3 and len(steps_runs) == MAX_MAP_SIDE
    assert any(r[0] < c <= r[-1] for r in steps_runs for c in cuts), "no run straddles a call"
    np.testing.assert_allclose(got.weights, pooled(w, 1, steps), atol=1e-6)
    sums = w.sum(-1)
    masked = np.where(eligible, 0.0, w).sum(-1)
    np.testing.assert_allclose(got.row_sum, [[s[r][np.argmax(np.abs(s[r] - 1))] for r in steps_runs]
                                             for s in sums], rtol=1e-12)
    np.testing.assert_allclose(got.masked_mass, [[m[r].max() for r in steps_runs] for m in masked],
                               rtol=1e-12)
    np.testing.assert_array_equal(got.eligible[0], np.stack([eligible[r].any(0)
                                                             for r in steps_runs]))
    assert got.query_labels[0] == "t0…t2" and got.query_labels[-1] == "t1098…t1099"


def test_a_captured_site_keeps_its_first_rows_over_every_call():
    """Captured sites keep their first 512 rows in all, whichever call brings them; keys
    that grow call by call (a cached decoder) are padded with no weight, not eligible."""
    torch.manual_seed(3)
    sizes, widths = [200, 200, 200], [30, 31, 33]
    calls = [torch.softmax(torch.randn(1, 1, q, k), -1) for q, k in zip(sizes, widths, strict=True)]
    masks = [torch.rand(1, 1, q, k) > 0.3 for q, k in zip(sizes, widths, strict=True)]
    builder = MapBuilder(torch.ones(0, dtype=torch.bool), torch.ones(0, dtype=torch.bool))
    for offset, (w, m) in enumerate(zip(calls, masks, strict=True)):
        builder.add(_call("c", "self", w, m), "captured", offset)
    got = builder.maps("", [], []).maps["c"]

    keys = max(widths)
    padded = [np.pad(w[0].double().numpy(), ((0, 0), (0, 0), (0, keys - w.shape[-1])))
              for w in calls]
    rows = np.concatenate(padded, axis=1)[:, :MAX_MAP_SIDE]
    eligible = np.concatenate([np.pad(m[0].numpy(), ((0, 0), (0, 0), (0, keys - m.shape[-1])))
                               for m in masks], axis=1)[:, :MAX_MAP_SIDE]
    assert got.weights.shape == (1, MAX_MAP_SIDE, keys)
    assert got.row_sum is not None and got.masked_mass is not None and got.eligible is not None
    np.testing.assert_allclose(got.weights, rows, atol=1e-7)
    np.testing.assert_array_equal(got.eligible, eligible)
    np.testing.assert_allclose(got.row_sum, rows.sum(-1), rtol=1e-12)
    np.testing.assert_allclose(got.masked_mass, np.where(eligible, 0.0, rows).sum(-1),
                               rtol=1e-12)
    assert got.query_labels == [str(i) for i in range(MAX_MAP_SIDE)]
    assert got.key_labels == [str(i) for i in range(keys)]


def _source_maps(n: int):
    torch.manual_seed(4)
    weights = torch.softmax(torch.randn(1, 1, n, n), -1)
    tokens = [f"s{i}" for i in range(n)]
    words = [i // 2 for i in range(n)]
    maps = example_maps({"e": _call("e", "self", weights)}, {"e": "encoder_self"}, "src",
                        tokens, [], torch.ones(n, dtype=torch.bool),
                        torch.zeros(0, dtype=torch.bool), words, "offsets",
                        declared={"e": None})
    return maps, weights[0].double().numpy(), tokens, words


def test_an_axis_of_exactly_the_limit_is_exact_and_keeps_its_words():
    maps, w, tokens, words = _source_maps(MAX_MAP_SIDE)
    got = maps.maps["e"]
    assert got.weights.shape == (1, MAX_MAP_SIDE, MAX_MAP_SIDE)
    np.testing.assert_allclose(got.weights, w, atol=1e-7)
    assert got.row_sum is not None
    np.testing.assert_allclose(got.row_sum, w.sum(-1), rtol=1e-12)
    assert got.query_labels == got.key_labels == tokens
    assert maps.words == words and maps.word_rule == "offsets"


def test_one_position_past_the_limit_averages_one_pair_of_rows_and_drops_the_words():
    n = MAX_MAP_SIDE + 1
    maps, w, _, _ = _source_maps(n)
    got = maps.maps["e"]
    pair_runs = runs(n)
    assert [len(r) for r in pair_runs].count(2) == 1 and len(pair_runs) == MAX_MAP_SIDE
    np.testing.assert_allclose(got.weights, key_pooled(pooled(w, 1, n), 2, n), atol=1e-6)
    pair = next(r for r in pair_runs if len(r) == 2)
    assert f"s{pair[0]}…s{pair[1]}" in got.query_labels
    # keys: 64 blocks of 8 (129 blocks of 4 would be too many) and the one key left
    assert [len(r) for r in key_runs(n)] == [8] * 64 + [1]
    assert got.key_labels[0] == "s0…s7" and got.key_labels[-1] == "s512"
    assert maps.words == [] and maps.word_rule == ""
