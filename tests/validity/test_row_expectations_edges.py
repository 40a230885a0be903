"""A target's expectation given per query row, (B, T, n), through the streamed audit.

The date BART declares, beside nothing else, an expectation whose expected source keys
differ at every step: at step ``t`` of an example with ``L`` source characters, characters
``t mod L`` and ``(3t + 1) mod L``, and on the first ``ROWS`` steps only. The audit streams
each cross-attention call, and with a memory budget of a few rows SDPA computes (and hands
over) the call in query blocks, so each block must read its own rows of the expectation.
Ground truth: the eager model's ``cross_attentions`` of one teacher-forced pass over the
audited output (the checkpoint loaded a second time, never captured), region mass and top
hit counted here by hand per site, head and step over the examples still decoding.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnaudit.targets.contract import Batch, Expectation
from attnaudit.validity.pipeline import run_validity_audit

transformers = pytest.importorskip("transformers")

EXAMPLES = 4
ROWS = 9  # of the date's 11 steps (10 characters and </s>)


def per_row_keys(batch: Batch, emitted: torch.Tensor) -> torch.Tensor:
    """Bool (B, T, n): the two expected source characters of each step."""
    out = torch.zeros(len(batch), emitted.shape[1], batch.source_ids.shape[1], dtype=torch.bool)
    for b, length in enumerate((batch.source_mask.sum(1) - 1).tolist()):  # less </s>
        for t in range(emitted.shape[1]):
            out[b, t, t % length] = out[b, t, (3 * t + 1) % length] = True
    return out


@pytest.fixture(scope="module")
def audited():
    from attnaudit_examples.date_transformer.target import make_target

    target = make_target().with_options(
        expectations=(Expectation("per row", per_row_keys, rows=ROWS),))
    result = run_validity_audit(target, limit=EXAMPLES, progress=False, timing=False,
                                keep_example=False, max_memory=4096)
    return target, result


def _by_hand(target) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray]:
    """Site -> (H, T) mean region mass and top hit over the counted rows, and (T,) counts."""
    from tests.helpers.date_bart_eager import eager_cross_attentions

    batch = next(target.iter_batches(EXAMPLES))
    emitted = target.greedy(batch)
    cross_attentions = eager_cross_attentions(batch, emitted)
    expected = per_row_keys(batch, emitted).numpy()  # (B, T, n)
    counted = target.step_mask(emitted).numpy().copy()
    counted[:, ROWS:] = False
    eligible = batch.source_mask.numpy()  # the declared cross rule: every real source key
    mass, hit = {}, {}
    for layer, weights in enumerate(cross_attentions):
        w = weights.double().numpy()  # (B, H, T, n)
        site = f"model.decoder.layers.{layer}.encoder_attn:cross"
        region = (w * (expected & eligible[:, None])[:, None]).sum(-1)  # (B, H, T)
        top = np.where(eligible[:, None, None], w, -np.inf).argmax(-1)  # (B, H, T)
        top_hit = np.take_along_axis(np.broadcast_to(expected[:, None], w.shape),
                                     top[..., None], -1)[..., 0]
        n = counted.sum(0)
        mass[site] = (region * counted[:, None]).sum(0) / np.maximum(n, 1)
        hit[site] = (top_hit * counted[:, None]).sum(0) / np.maximum(n, 1)
    return mass, hit, counted.sum(0)


def test_per_row_expectations_are_read_row_by_row_in_query_blocks(audited):
    target, result = audited
    mass, hit, n = _by_hand(target)
    regions = result.regions
    assert set(regions["expectation"]) == {"per row"}
    per_head = regions[~regions["site"].str.endswith(":head_mean")]
    assert set(per_head["site"]) == set(mass)
    assert set(per_head["step"]) == set(range(ROWS))
    for metric, truth in (("region_mass", mass), ("top_weight_hit", hit)):
        rows = per_head[per_head["metric"] == metric]
        assert len(rows) == sum(t[:, :ROWS].size for t in truth.values())
        for row in rows.itertuples(index=False):
            assert row.n == n[row.step], (metric, row.site, row.head, row.step)
            want = truth[row.site][row.head, row.step]
            assert abs(row.mean - want) <= 1e-5, (metric, row.site, row.head, row.step)
    # the expectation moves with the step: the per-step means are not one number
    assert np.ptp(mass[next(iter(mass))][:, :ROWS]) > 0.05
