"""Values an SDPA call broadcasts over its heads (multi-query attention: one key/value head
for every query head) are kept per head, equal to the shared head."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import attnaudit


class MultiQuery(torch.nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v)


def test_values_shared_by_every_head_are_recorded_for_each_head():
    torch.manual_seed(0)
    q = torch.randn(2, 4, 3, 8)
    k, v = torch.randn(2, 1, 5, 8), torch.randn(2, 1, 5, 8)
    model = MultiQuery()
    with attnaudit.capture(model, values=True) as cap:
        out = model(q, k, v)
    (record,) = cap.records.values()
    assert record.values.shape == (2, 4, 5, 8)
    torch.testing.assert_close(record.values, v.expand(2, 4, 5, 8))
    torch.testing.assert_close(torch.matmul(record.weights, record.values), out)
