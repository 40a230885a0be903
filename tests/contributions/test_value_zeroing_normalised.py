"""Value zeroing normalised per query row as Mohebbi et al. (2023) do: the distances 1 - cos
of a row divided by their sum over the keys the row reads, the raw distances kept as
``value_zeroing_raw``. Expected values by numpy loops; the alignment error rate read per
layer cannot move (a positive factor per row keeps every row's argmax)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnaudit.contributions import measure_maps
from attnaudit.contributions.zeroing import normalise_rows


def test_normalise_rows_matches_numpy_loops():
    gen = torch.Generator().manual_seed(3)
    raw = torch.rand(2, 4, 6, generator=gen)
    reads = torch.rand(2, 4, 6, generator=gen) > 0.3
    reads[0, 0] = False  # a row that reads nothing
    raw[1, 1] = 0.0  # a row whose distances are all 0
    got = normalise_rows(raw, reads).double().numpy()
    for b in range(2):
        for q in range(4):
            row = [float(raw[b, q, k]) if reads[b, q, k] else 0.0 for k in range(6)]
            total = sum(row)
            expected = [x / total if total > 0 else 0.0 for x in row]
            np.testing.assert_allclose(got[b, q], expected, atol=1e-7)


@pytest.fixture(scope="module")
def date_bart():
    pytest.importorskip("transformers")
    from attnaudit_examples.date_transformer.target import make_target

    target = make_target()
    batch = next(target.iter_batches(4))
    emitted = target.greedy(batch)
    return target, batch, emitted


def test_date_bart_rows_sum_to_one_over_real_keys(date_bart):
    """Padded source keys (zero weight in every head) score 0; the rest of each row is the
    raw row over its own sum, computed here from the raw map."""
    target, batch, emitted = date_bart
    maps = measure_maps(target, batch, emitted, ["value_zeroing", "value_zeroing_raw"])
    norm, raw = maps["value_zeroing"].double().numpy(), maps["value_zeroing_raw"].double().numpy()
    real = batch.source_mask.numpy()
    assert not real.all()  # the batch is padded
    steps = target.step_mask(emitted).numpy()
    for b in range(len(batch)):
        for layer in range(norm.shape[1]):
            for t in np.nonzero(steps[b])[0]:
                row = np.where(real[b], raw[b, layer, t], 0.0)
                np.testing.assert_allclose(norm[b, layer, t], row / row.sum(), atol=1e-6)
                assert norm[b, layer, t].argmax() == row.argmax()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_per_layer_aer_is_the_raw_distances_aer():
    pytest.importorskip("transformers")
    from attnaudit.alignments.run import aer_table
    from attnaudit_examples.date import gold as date_gold
    from attnaudit_examples.date_transformer.target import make_target

    limit = 12
    table = aer_table(make_target(), date_gold.audit_gold(limit),
                      ["value_zeroing", "value_zeroing_raw"], units="tokens", limit=limit)
    per_layer = table[table["layer"] != "mean"]
    assert len(per_layer) >= 4
    for (layer, convention), group in per_layer.groupby(["layer", "convention"]):
        by = group.set_index("measure")
        assert by.loc["value_zeroing", "aer"] == by.loc["value_zeroing_raw", "aer"], \
            (layer, convention)
        assert by.loc["value_zeroing", "links"] == by.loc["value_zeroing_raw", "links"]
