"""SDPA computed in query blocks within a memory budget: outputs equal the fused call,
weights (kept or streamed) equal an independent softmax, and a blocked edit equals a
hand-written forward with the edited weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import attnaudit
from attnaudit.capturing.blocks import BYTES_PER_WEIGHT, block_rows, query_blocks
from tests.capturing.test_sdpa_path import SdpaBlock, reference_weights

BATCH, N, HEADS = 3, 23, 2
ROWS = 4  # query rows per block under BUDGET
BUDGET = ROWS * BATCH * HEADS * N * BYTES_PER_WEIGHT


def inputs(seed: int = 0) -> tuple[SdpaBlock, torch.Tensor]:
    torch.manual_seed(seed)
    return SdpaBlock(heads=HEADS), torch.randn(BATCH, N, 8)


def masks() -> dict[str, dict]:
    allowed = torch.ones(BATCH, 1, N, N, dtype=torch.bool).tril()
    allowed[1, :, :, 15:] = False
    allowed[2, :, 5, :] = False  # a row with every key masked: zero weights, zero output
    additive = torch.zeros(BATCH, 1, 1, N)
    additive[0, ..., 20:] = float("-inf")
    return {"none": {}, "causal": {"is_causal": True}, "bool": {"attn_mask": allowed},
            "float": {"attn_mask": additive}}


def reference(block: SdpaBlock, x: torch.Tensor, kwargs: dict) -> torch.Tensor:
    q, k, _ = block.split(x)
    if kwargs.get("is_causal"):
        return reference_weights(q, k, allowed=torch.ones(N, N, dtype=torch.bool).tril())
    mask = kwargs.get("attn_mask")
    if mask is not None and mask.dtype == torch.bool:
        return reference_weights(q, k, allowed=mask)
    return reference_weights(q, k, additive=mask)


def test_block_rows_follow_the_budget():
    assert block_rows(BATCH * HEADS * N, BUDGET) == ROWS
    assert block_rows(10**9, 1) == 1
    assert query_blocks(10, 4) == [(0, 4), (4, 8), (8, 10)]


@pytest.mark.parametrize("mask", list(masks()))
def test_blocked_outputs_and_weights_equal_the_fused_call(mask):
    kwargs = masks()[mask]
    block, x = inputs()
    with torch.no_grad():
        fused = block(x, **kwargs)
        with attnaudit.capture(block, max_memory=BUDGET) as cap:
            blocked = block(x, **kwargs)
    torch.testing.assert_close(blocked, fused.nan_to_num(0.0), atol=1e-5, rtol=1e-5)
    (record,) = cap.records.values()
    assert len(record.calls) == len(query_blocks(N, ROWS))
    assert [c.weights.shape[2] for c in record.calls] == [4, 4, 4, 4, 4, 3]
    torch.testing.assert_close(record.weights, reference(block, x, kwargs), atol=1e-5,
                               rtol=1e-5)


def test_streamed_blocks_keep_nothing_and_arrive_in_order():
    block, x = inputs(1)
    seen = []
    with torch.no_grad(), attnaudit.capture(
            block, max_memory=BUDGET, keep=False,
            on_call=lambda site, call: seen.append((site.call, site.query_offset,
                                                    call.weights.clone()))) as cap:
        block(x, is_causal=True)
    assert cap.records == {} and list(cap.recorded) == cap.sites
    assert [(c, o) for c, o, _ in seen] == [(i, s) for i, (s, _) in
                                           enumerate(query_blocks(N, ROWS))]
    stacked = torch.cat([w for *_, w in seen], dim=2)
    q, k, _ = block.split(x)
    expected = reference_weights(q, k, allowed=torch.ones(N, N, dtype=torch.bool).tril())
    torch.testing.assert_close(stacked, expected, atol=1e-5, rtol=1e-5)


def test_a_blocked_edit_equals_a_hand_written_forward():
    """The edit puts all of row r's weight on key r // 2 (by the row's place in the call,
    from ``site.query_offset``); the model's output is that of those weights."""
    block, x = inputs(2)

    def edit(site, weights, key_mask):
        new = torch.zeros_like(weights)
        rows = torch.arange(weights.shape[2]) + site.query_offset
        new[:, :, torch.arange(weights.shape[2]), rows // 2] = 1.0
        return new

    with torch.no_grad(), attnaudit.capture(block, edit=edit, max_memory=BUDGET) as cap:
        out = block(x, is_causal=True)
    assert len(cap.records[cap.sites[0]].calls) > 1  # the edit was applied block by block
    _, _, v = block.split(x)
    with torch.no_grad():
        by_hand = v[:, :, torch.arange(N) // 2]  # (B, H, N, d): row r reads value r // 2
    torch.testing.assert_close(out, by_hand, atol=1e-6, rtol=1e-6)
    assert not torch.allclose(out, F.scaled_dot_product_attention(*block.split(x),
                                                                  is_causal=True))
