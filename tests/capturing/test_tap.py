"""attnaudit.tap: explicit sites in code the user owns."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import attnaudit


class Tapped(nn.Module):
    def forward(self, scores: torch.Tensor, values: torch.Tensor, valid: torch.Tensor):
        weights = torch.exp(scores) * valid  # attention not written as a softmax call
        weights = weights / weights.sum(-1, keepdim=True)
        weights = attnaudit.tap("pooling", weights, key_mask=valid, kind="self")
        return weights @ values


def inputs():
    torch.manual_seed(0)
    valid = torch.ones(2, 1, 5, dtype=torch.bool)
    valid[1, :, 3:] = False
    return torch.randn(2, 1, 5), torch.randn(2, 5, 3), valid


def test_tap_without_capture_returns_the_same_tensor():
    w = torch.rand(2, 3)
    assert attnaudit.tap("anything", w) is w


def test_tap_records_weights_and_mask():
    model = Tapped()
    scores, values, valid = inputs()
    with attnaudit.capture(model) as cap:
        model(scores, values, valid)
    rec = cap.records["pooling"]
    assert rec.kind == "self" and rec.site.mechanism == "tap"
    expected = torch.exp(scores) * valid
    expected = expected / expected.sum(-1, keepdim=True)
    assert rec.weights.shape == (2, 1, 1, 5)
    assert torch.allclose(rec.weights[:, 0], expected)
    assert torch.equal(rec.key_mask[:, 0], valid)


def test_tap_edit_replaces_weights():
    model = Tapped()
    scores, values, valid = inputs()

    def first_key_only(site, weights, key_mask):
        out = torch.zeros_like(weights)
        out[..., 0] = 1.0
        return out

    with attnaudit.capture(model, edit=first_key_only):
        out = model(scores, values, valid)
    assert torch.allclose(out, values[:, :1, :])


def test_tap_rejects_mask_that_does_not_broadcast():
    class WrongMask(nn.Module):
        def forward(self, weights):
            return attnaudit.tap("w", weights, key_mask=torch.ones(2, 4, dtype=torch.bool))

    with pytest.raises(ValueError, match="does not broadcast"), attnaudit.capture(WrongMask()):
        WrongMask()(torch.rand(2, 5))


def test_tap_inside_an_edit_is_not_recorded():
    model = Tapped()
    scores, values, valid = inputs()

    def edit_that_taps(site, weights, key_mask):
        return attnaudit.tap("inside_edit", weights)  # e.g. a helper shared with the model

    with attnaudit.capture(model, edit=edit_that_taps) as cap:
        model(scores, values, valid)
    assert cap.sites == ["pooling"]
    assert list(cap.records) == ["pooling"]
