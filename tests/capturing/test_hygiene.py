"""Capture leaves no trace: patches, hooks, flags, modes and parameters are restored."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import attnaudit
from attnaudit.capturing import logsumexp, sdpa, softmax
from tests.helpers.fingerprints import assert_unchanged, model_fingerprint


def assert_torch_restored():
    assert torch.softmax is softmax.ORIGINAL_TORCH_SOFTMAX
    assert F.softmax is softmax.ORIGINAL_F_SOFTMAX
    assert "softmax" not in vars(torch.Tensor)
    assert F.scaled_dot_product_attention is sdpa.ORIGINAL_SDPA
    assert torch.exp is logsumexp.ORIGINAL_TORCH_EXP
    assert torch.logsumexp is logsumexp.ORIGINAL_TORCH_LOGSUMEXP
    assert torch.Tensor.exp is logsumexp.ORIGINAL_TENSOR_EXP
    assert torch.Tensor.logsumexp is logsumexp.ORIGINAL_TENSOR_LOGSUMEXP
    assert logsumexp.PENDING.pending is None
    assert torch.backends.mha.get_fastpath_enabled()


def transformer() -> nn.Transformer:
    torch.manual_seed(0)
    return nn.Transformer(d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                          dim_feedforward=16, batch_first=True)


def test_normal_exit_restores_everything(date_model, date_batch):
    src, lengths, _ = date_batch
    date_model.train()
    date_model.out.weight.requires_grad_(False)
    before = model_fingerprint(date_model)
    with attnaudit.capture(date_model):
        date_model(src, lengths, torch.ones(64, 3, dtype=torch.long))
    assert_unchanged(date_model, before)
    assert_torch_restored()


def test_exception_inside_context_restores_everything():
    model = transformer()
    before = model_fingerprint(model)
    with pytest.raises(ZeroDivisionError), attnaudit.capture(model):
        model(torch.randn(2, 3, 8), torch.randn(2, 4, 8))
        1 / 0  # noqa: B018
    assert_unchanged(model, before)
    assert_torch_restored()


def test_exception_inside_the_model_restores_everything():
    model = transformer().eval()
    before = model_fingerprint(model)
    with pytest.raises(RuntimeError), attnaudit.capture(model):
        model(torch.randn(2, 3, 8), torch.randn(2, 4, 7))  # wrong width: fails inside MHA
    assert_unchanged(model, before)
    assert_torch_restored()


def test_failing_edit_restores_everything(date_model, date_batch):
    src, lengths, _ = date_batch
    before = model_fingerprint(date_model)
    with pytest.raises(attnaudit.EditError, match="returned shape"), \
            attnaudit.capture(date_model, edit=lambda s, w, m: w[..., :2]):
        date_model.greedy(src, lengths)
    with pytest.raises(attnaudit.EditError, match="not a tensor"), \
            attnaudit.capture(date_model, edit=lambda s, w, m: "uniform"):
        date_model.greedy(src, lengths)
    assert_unchanged(date_model, before)
    assert_torch_restored()


class NaNAttention(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = x @ x.transpose(1, 2)
        scores[0, 1] = float("nan")
        return torch.softmax(scores, -1) @ x


def test_nan_weights_are_recorded_not_crashed_on():
    model = NaNAttention()
    with attnaudit.capture(model) as cap:
        out = model(torch.randn(2, 3, 4))
    rec = cap.records["forward"]
    assert torch.isnan(rec.weights[0, 0, 1]).all()
    assert torch.isfinite(rec.weights[1]).all()
    assert rec.key_mask[0, 0, 1].all()  # NaN scores are not read as masked
    assert torch.isnan(out[0, 1]).all()
    assert_torch_restored()


class NoAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(4, 4, batch_first=True)

    def forward(self, x):
        return self.lstm(x)[0].log_softmax(-1)


def test_model_without_attention_raises_and_says_what_was_searched():
    model = NoAttention()
    with pytest.raises(attnaudit.NoAttentionFound) as err, attnaudit.capture(model):
        model(torch.randn(2, 3, 4))
    message = str(err.value)
    for searched in ("NoAttention", "torch.softmax", "F.softmax", "Tensor.softmax",
                     "F.scaled_dot_product_attention", "nn.MultiheadAttention", "attnaudit.tap"):
        assert searched in message
    assert_torch_restored()


def test_unknown_requested_site_is_an_error(date_model, date_batch):
    src, lengths, _ = date_batch
    with pytest.raises(attnaudit.SiteNotFound, match=r"attnd.*sites found: \['attend'\]"), \
            attnaudit.capture(date_model, sites=["attnd"]):
        date_model.greedy(src, lengths, steps=1)


def test_site_selection_by_name_and_predicate():
    model = transformer().eval()
    src, tgt = torch.randn(2, 3, 8), torch.randn(2, 4, 8)
    with attnaudit.capture(model, sites=["decoder.layers.0.multihead_attn"]) as cap:
        model(src, tgt)
    assert list(cap.records) == ["decoder.layers.0.multihead_attn:cross"]
    assert len(cap.sites) == 3
    with attnaudit.capture(model, sites=lambda name: name.endswith(":self")) as cap:
        model(src, tgt)
    assert sorted(cap.records) == ["decoder.layers.0.self_attn:self",
                                   "encoder.layers.0.self_attn:self"]


def test_captures_do_not_nest(date_model, date_batch):
    src, lengths, _ = date_batch
    with attnaudit.capture(date_model) as cap:
        with pytest.raises(attnaudit.CaptureError, match="nest"), attnaudit.capture(date_model):
            pass  # pragma: no cover
        date_model.greedy(src, lengths, steps=1)
    assert cap.sites == ["attend"]
    assert_torch_restored()


def test_not_a_module_is_a_type_error():
    with pytest.raises(TypeError, match=r"torch\.nn\.Module"):
        attnaudit.capture(lambda x: x)


def test_unsupported_hf_backend_is_refused():
    class Config:
        _attn_implementation = "flash_attention_2"

    model = nn.Linear(2, 2)
    model.config = Config()
    with pytest.raises(attnaudit.CaptureError, match="flash_attention_2"), attnaudit.capture(model):
        pass  # pragma: no cover
    assert_torch_restored()


def test_record_refuses_to_stack_different_batches(date_model, date_batch):
    src, lengths, _ = date_batch
    with attnaudit.capture(date_model) as cap:
        date_model.greedy(src, lengths, steps=1)
        date_model.greedy(src[:3], lengths[:3], steps=1)
    rec = cap.records["attend"]
    assert len(rec.calls) == 2
    with pytest.raises(ValueError, match=r"record\.calls"):
        _ = rec.weights
