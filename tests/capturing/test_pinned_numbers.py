"""Capture's boundary cases against expectations built here: the masking threshold exactly
at -1e4 (and just above it), steps stacked in call order against a hand-written greedy
decoder, and the flex backend refused on a real Hugging Face model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import attnaudit
from attnaudit.capturing import sdpa, softmax
from tests.helpers.date_reference import hand_written_decode

# The README's rule: a key is masked when its score is at or below -1e4.
AT_THRESHOLD, ABOVE_THRESHOLD = -1e4, -9999.0


class FilledSoftmax(nn.Module):
    """Dot-product attention whose padding scores are filled with ``fill``."""

    def __init__(self, fill: float) -> None:
        super().__init__()
        self.fill = fill

    def forward(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        scores = (x @ x.transpose(1, 2)).masked_fill(~valid[:, None, :], self.fill)
        return torch.softmax(scores, -1) @ x


class AdditiveSdpa(nn.Module):
    """F.scaled_dot_product_attention with an additive float mask of ``fill`` on padding."""

    def __init__(self, fill: float) -> None:
        super().__init__()
        self.fill = fill

    def forward(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        additive = torch.zeros(valid.shape).masked_fill(~valid, self.fill)[:, None, None, :]
        q = x[:, None]
        return F.scaled_dot_product_attention(q, q, q, attn_mask=additive)


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(0))
    valid = torch.tensor([[True] * 5, [True, True, True, False, False], [True, False] * 2 + [True]])
    return x, valid


@pytest.mark.parametrize("model_class", [FilledSoftmax, AdditiveSdpa])
@pytest.mark.parametrize(("fill", "masked"), [(AT_THRESHOLD, True), (-1e9, True),
                                              (float("-inf"), True), (ABOVE_THRESHOLD, False)])
def test_masking_threshold_is_at_or_below_minus_1e4(model_class, fill, masked):
    x, valid = _inputs()
    with torch.no_grad(), attnaudit.capture(model_class(fill)) as cap:
        cap.model(x, valid)
    [rec] = cap.records.values()
    key_mask = rec.key_mask.expand_as(rec.weights)
    expected = valid if masked else torch.ones_like(valid)
    assert torch.equal(key_mask, expected[:, None, None, :].expand_as(key_mask))


def test_decoder_steps_stack_in_call_order(date_model, date_batch):
    src, lengths, _ = date_batch
    with torch.no_grad():
        expected, _, _ = hand_written_decode(date_model, src, lengths)
        with attnaudit.capture(date_model) as cap:
            date_model.greedy(src, lengths)
    rec = cap.records["attend"]
    assert rec.weights.shape == (64, 1, 11, src.shape[1])
    torch.testing.assert_close(rec.weights[:, 0], expected, atol=1e-5, rtol=0)
    for step, call in enumerate(rec.calls):
        torch.testing.assert_close(call.weights[:, 0, 0], expected[:, step], atol=1e-5, rtol=0)
    # the steps really differ, so another order could not pass
    assert (expected[:, 1:] - expected[:, :-1]).abs().amax() > 0.5


def test_flex_backend_is_refused_on_a_hugging_face_model():
    pytest.importorskip("transformers")
    from attnaudit_examples.date_transformer.model import load_model

    model, _ = load_model()
    model.config._attn_implementation = "flex_attention"
    refused = pytest.raises(attnaudit.CaptureError, match="'flex_attention' attention backend")
    with refused, attnaudit.capture(model):
        pass  # pragma: no cover
    assert torch.softmax is softmax.ORIGINAL_TORCH_SOFTMAX
    assert F.scaled_dot_product_attention is sdpa.ORIGINAL_SDPA
