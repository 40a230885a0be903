"""Example maps built call by call equal those built from a whole record, and past 512
positions a query axis is averaged in equal runs, a key axis in blocks: weights, labels and
the validity annotations (eligible keys, row sums, masked mass over every key of a row)
checked against numpy."""

from __future__ import annotations

import numpy as np
import torch

from attnaudit.analysis.example_maps import MapBuilder, example_maps
from attnaudit.record import AttentionCall, AttentionRecord, Site
from tests.helpers.map_runs import key_pooled, key_runs, pooled, runs


def record_of(name: str, kind: str, weights: torch.Tensor, *, calls: int = 1
              ) -> AttentionRecord:
    """A record of ``weights`` (B, H, Q, K) split on the query axis into ``calls`` calls."""
    record = AttentionRecord(Site(name, kind, "softmax", name))
    for part in torch.tensor_split(weights, calls, dim=2):
        record.append(AttentionCall(part))
    return record


def test_a_long_source_is_averaged_in_blocks_and_calls_add_up_to_the_record():
    torch.manual_seed(0)
    n, real, steps = 1105, 1100, 3
    source_mask = torch.arange(n) < real
    step_mask = torch.tensor([True, True, True, False])
    weights = torch.softmax(torch.randn(2, 2, steps + 1, n), -1)  # padding gets weight too
    declared = source_mask[None, None, None, :].expand(2, 1, 1, n)
    tokens = [f"t{i}" for i in range(n)]
    whole = example_maps({"x": record_of("x", "cross", weights)}, {"x": "cross"}, "src",
                         tokens, list("abcd"), source_mask, step_mask, example=1,
                         declared={"x": declared}).maps["x"]
    builder = MapBuilder(source_mask, step_mask, example=1)
    for offset, part in enumerate(torch.tensor_split(weights, steps + 1, dim=2)):
        call = record_of("x", "cross", part)
        builder.add(call, "cross", offset, declared)
    streamed = builder.maps("src", tokens, list("abcd")).maps["x"]

    w = weights[1, :, :steps].double().numpy()  # (H, 3, n): the kept rows, every key
    np.testing.assert_allclose(whole.weights, key_pooled(w[:, :, :real], 2, real), atol=1e-7)
    assert whole.weights.shape == (2, steps, len(key_runs(real))) == (2, steps, 69)
    np.testing.assert_allclose(whole.row_sum, w.sum(-1), rtol=1e-12)
    np.testing.assert_allclose(whole.masked_mass, w[:, :, real:].sum(-1), rtol=1e-12)
    assert whole.masked_mass.min() > 0  # weight on the padding is masked mass
    assert whole.eligible.all() and whole.eligible.shape == whole.weights.shape
    assert whole.key_labels[0] == "t0…t15" and whole.key_labels[-1] == "t1088…t1099"
    assert whole.query_labels == list("abc")
    for field in ("weights", "eligible", "row_sum", "masked_mass"):
        np.testing.assert_array_equal(getattr(streamed, field), getattr(whole, field), field)
    assert streamed.key_labels == whole.key_labels


def test_averaged_rows_show_their_worst_row_sum_and_masked_mass():
    torch.manual_seed(1)
    n = 600
    mask = torch.ones(n, dtype=torch.bool)
    weights = torch.softmax(torch.randn(1, 1, n, n), -1)
    weights[0, 0, 7] *= 1.5  # one bad row sum
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    maps = example_maps({"d": record_of("d", "self", weights, calls=5)},
                        {"d": "decoder_self"}, "", [], [str(i) for i in range(n)],
                        torch.zeros(0, dtype=torch.bool), mask,
                        declared={"d": causal[None, None]}).maps["d"]
    w = weights[0].double().numpy()
    sums = w.sum(-1)[0]
    masked = np.where(causal.numpy(), 0.0, w[0]).sum(-1)
    worst = [sums[r][np.argmax(np.abs(sums[r] - 1))] for r in runs(n)]
    np.testing.assert_allclose(maps.row_sum[0], worst, rtol=1e-12)
    np.testing.assert_allclose(maps.masked_mass[0], [masked[r].max() for r in runs(n)],
                               rtol=1e-12)
    run = next(i for i, r in enumerate(runs(n)) if 7 in r)
    assert maps.row_sum[0, run] > 1.4
    np.testing.assert_allclose(maps.weights, key_pooled(pooled(w, 1, n), 2, n), atol=1e-6)
    # a cell is eligible when any of its positions is: above the diagonal's runs, none is
    eligible = np.stack([[causal.numpy()[np.ix_(q, k)].any() for k in key_runs(n)]
                         for q in runs(n)])
    np.testing.assert_array_equal(maps.eligible[0], eligible)
    assert maps.key_labels[0] == "<start>…6" and maps.query_labels[0] == "0…1"
