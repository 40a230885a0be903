"""nn.MultiheadAttention adapter, alone and inside nn.Transformer (eval + no_grad fast paths)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import attnaudit


def per_head(mha: nn.MultiheadAttention, q, k, v, **kwargs) -> torch.Tensor:
    """Ground truth: the module's own per-head weights (B, H, Lq, Lk)."""
    with torch.no_grad():
        _, w = mha(q, k, v, need_weights=True, average_attn_weights=False, **kwargs)
    return w


def build_transformer() -> nn.Transformer:
    torch.manual_seed(0)
    return nn.Transformer(d_model=16, nhead=4, num_encoder_layers=2, num_decoder_layers=2,
                          dim_feedforward=32, dropout=0.0, batch_first=True).eval()


def transformer_inputs():
    torch.manual_seed(1)
    src, tgt = torch.randn(3, 7, 16), torch.randn(3, 5, 16)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[1, 5:] = True
    causal = nn.Transformer.generate_square_subsequent_mask(5)
    kwargs = dict(tgt_mask=causal, src_key_padding_mask=pad, memory_key_padding_mask=pad,
                  tgt_is_causal=True)
    return src, tgt, pad, causal, kwargs


def reference_transformer_weights(model: nn.Transformer, src, tgt, pad, causal):
    """Walk the post-norm layers by hand, asking each attention module for its weights."""
    ref = {}
    x = src
    with torch.no_grad():
        for i, layer in enumerate(model.encoder.layers):
            ref[f"encoder.layers.{i}.self_attn:self"] = per_head(layer.self_attn, x, x, x,
                                                                 key_padding_mask=pad)
            x = layer(x, src_key_padding_mask=pad)
        memory = model.encoder.norm(x)
        y = tgt
        for i, layer in enumerate(model.decoder.layers):
            ref[f"decoder.layers.{i}.self_attn:self"] = per_head(layer.self_attn, y, y, y,
                                                                 attn_mask=causal)
            z = layer.norm1(y + layer.self_attn(y, y, y, attn_mask=causal)[0])
            ref[f"decoder.layers.{i}.multihead_attn:cross"] = per_head(
                layer.multihead_attn, z, memory, memory, key_padding_mask=pad)
            y = layer(y, memory, tgt_mask=causal, memory_key_padding_mask=pad, tgt_is_causal=True)
    return ref


@pytest.mark.parametrize("grad", [False, True])
def test_transformer_weights_every_layer_and_head(grad):
    model = build_transformer()
    src, tgt, pad, causal, kwargs = transformer_inputs()
    with torch.set_grad_enabled(grad):
        plain = model(src, tgt, **kwargs)  # eval + no_grad takes PyTorch's fused fast path
        with attnaudit.capture(model) as cap:
            out = model(src, tgt, **kwargs)
    ref = reference_transformer_weights(model, src, tgt, pad, causal)
    assert sorted(cap.records) == sorted(ref)
    for name, expected in ref.items():
        rec = cap.records[name]
        assert rec.site.mechanism == "mha"
        assert rec.kind == name.rsplit(":", 1)[1]
        got = rec.weights
        assert got.shape == expected.shape
        assert (got - expected).abs().max().item() <= 1e-5, name
    assert (out - plain).abs().max().item() <= 1e-5
    cross = cap.records["decoder.layers.0.multihead_attn:cross"]
    assert not cross.key_mask.expand(3, 4, 5, 7)[1, :, :, 5:].any()
    self_ = cap.records["decoder.layers.1.self_attn:self"]
    assert torch.equal(self_.key_mask.expand(3, 4, 5, 5)[0, 0], torch.ones(5, 5).tril().bool())
    assert torch.backends.mha.get_fastpath_enabled()


def test_need_weights_false_caller_still_gets_none():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(2, 4, 8)

    class Owner(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = mha

        def forward(self, x):
            return self.attn(x, x, x, need_weights=False)

    owner = Owner()
    with torch.no_grad(), attnaudit.capture(owner) as cap:
        _, weights = owner(x)
    assert weights is None
    assert cap.records["attn:self"].weights.shape == (2, 2, 4, 4)


def test_averaged_weights_returned_when_asked():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    q, kv = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
    expected_out, expected_avg = mha(q, kv, kv)
    with attnaudit.capture(mha) as cap:
        out, avg = mha(q, kv, kv)
    assert torch.allclose(avg, expected_avg, atol=1e-6)
    assert torch.allclose(out, expected_out, atol=1e-6)
    rec = cap.records["forward:cross"]
    assert torch.allclose(rec.weights.mean(1), expected_avg, atol=1e-6)


def test_uniform_edit_equals_hand_written_uniform_mha():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    q, kv = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
    pad = torch.tensor([[False] * 5, [False, False, False, True, True]])

    def uniform(site, weights, key_mask):
        eligible = key_mask.expand_as(weights).to(weights.dtype)
        return eligible / eligible.sum(-1, keepdim=True)

    with torch.no_grad():
        with attnaudit.capture(mha, edit=uniform):
            out, _ = mha(q, kv, kv, key_padding_mask=pad)
        w_v = mha.in_proj_weight[16:]
        b_v = mha.in_proj_bias[16:]
        v = kv @ w_v.T + b_v  # (2, 5, 8), heads are contiguous 4-wide slices
        valid = (~pad).float()
        mean_v = (v * valid[..., None]).sum(1) / valid.sum(1, keepdim=True)  # (2, 8)
        ref = mha.out_proj(mean_v)[:, None, :].expand(2, 3, 8)
    assert (out - ref).abs().max().item() <= 1e-5
