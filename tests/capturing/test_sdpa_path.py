"""SDPA adapter: weights recomputed explicitly, outputs identical to the fused call."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.functional import scaled_dot_product_attention as imported_sdpa

import attnaudit


class SdpaBlock(nn.Module):
    """Multi-head attention over projected inputs; the mask convention is chosen per test."""

    def __init__(self, heads: int = 2, dim: int = 8, imported: bool = False) -> None:
        super().__init__()
        self.heads, self.imported = heads, imported
        self.qkv = nn.Linear(dim, 3 * dim)

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b, n, d = x.shape
        q, k, v = self.qkv(x).chunk(3, -1)
        return tuple(t.reshape(b, n, self.heads, d // self.heads).transpose(1, 2)
                     for t in (q, k, v))

    def forward(self, x: torch.Tensor, **sdpa_kwargs) -> torch.Tensor:
        q, k, v = self.split(x)
        fn = imported_sdpa if self.imported else F.scaled_dot_product_attention
        return fn(q, k, v, **sdpa_kwargs)


def reference_weights(q, k, allowed=None, additive=None, scale=None):
    """Independent softmax(QK^T * scale + mask) with zero rows where every key is masked."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.einsum("bhqd,bhkd->bhqk", q.double(), k.double()) * scale
    if additive is not None:
        scores = scores + additive.double()
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    top = scores.amax(-1, keepdim=True).nan_to_num(0.0, neginf=0.0)
    e = torch.exp(scores - top)
    total = e.sum(-1, keepdim=True)
    return torch.where(total > 0, e / total.clamp_min(1e-300), torch.zeros_like(e)).float()


def make_inputs(seed=0, batch=3, n=6):
    torch.manual_seed(seed)
    block = SdpaBlock()
    x = torch.randn(batch, n, 8)
    return block, x


def padding_mask(batch=3, n=6):
    allowed = torch.ones(batch, 1, 1, n, dtype=torch.bool)
    allowed[1, ..., 4:] = False
    return allowed


CASES = {
    "no mask": lambda n: ({}, None, None),
    "bool mask": lambda n: ({"attn_mask": padding_mask(n=n)}, padding_mask(n=n), None),
    "float mask": lambda n: (
        {"attn_mask": torch.zeros(3, 1, 1, n).masked_fill(~padding_mask(n=n), float("-inf"))},
        padding_mask(n=n), None),
    "additive bias": lambda n: ({"attn_mask": torch.linspace(-1, 1, n * n).reshape(n, n)}, None,
                                torch.linspace(-1, 1, n * n).reshape(n, n)),
    "causal": lambda n: ({"is_causal": True}, torch.ones(n, n, dtype=torch.bool).tril(), None),
    "scale": lambda n: ({"scale": 0.3}, None, None),
}


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("imported", [False, True])
def test_weights_and_outputs_match(case, grad, imported):
    block, x = make_inputs()
    block.imported = imported
    kwargs, allowed, additive = CASES[case](x.shape[1])
    with torch.set_grad_enabled(grad):
        fused = block(x, **kwargs)
        with attnaudit.capture(block) as cap:
            out = block(x, **kwargs)
        q, k, _ = block.split(x)
    assert cap.sites == ["forward:self"] if case == "causal" else cap.sites == ["forward"]
    rec = next(iter(cap.records.values()))
    assert rec.site.mechanism == "sdpa"
    ref = reference_weights(q.detach(), k.detach(), allowed, additive, kwargs.get("scale"))
    assert rec.weights.shape == (3, 2, 6, 6)
    assert (rec.weights - ref).abs().max().item() <= 1e-5
    assert (out - fused).abs().max().item() <= 1e-5
    assert out.requires_grad == grad
    expected_mask = torch.ones(3, 2, 6, 6, dtype=torch.bool)
    if allowed is not None:
        expected_mask &= allowed
    assert torch.equal(rec.key_mask.expand(3, 2, 6, 6), expected_mask)


class PlainSdpa(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


@pytest.mark.parametrize("lead", [(2,), ()], ids=["3-d: one head", "2-d: one sequence"])
def test_inputs_without_a_head_axis_read_as_one_head(lead):
    torch.manual_seed(1)
    q, k, v = torch.randn(*lead, 4, 5), torch.randn(*lead, 7, 5), torch.randn(*lead, 7, 3)
    model = PlainSdpa()
    with attnaudit.capture(model) as cap:
        out = model(q, k, v)
    rec = cap.records["forward"]
    assert rec.weights.shape == ((*lead, 1, 4, 7) if lead else (1, 1, 4, 7))
    ref = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(5), -1)
    assert (rec.weights.reshape(ref.shape) - ref).abs().max().item() <= 1e-5
    assert (out - ref @ v).abs().max().item() <= 1e-5


@pytest.mark.parametrize("mask_type", ["bool", "float"])
def test_all_masked_row_gives_zero_weights_like_the_fused_kernel(mask_type):
    block, x = make_inputs()
    allowed = padding_mask().expand(3, 1, 6, 6).clone()
    allowed[0, 0, 2] = False  # query 2 of example 0 may see nothing
    mask = allowed if mask_type == "bool" else torch.zeros(allowed.shape).masked_fill(
        ~allowed, float("-inf"))
    fused = block(x, attn_mask=mask)
    with attnaudit.capture(block) as cap:
        out = block(x, attn_mask=mask)
    assert torch.equal(cap.records["forward"].weights[0, :, 2], torch.zeros(2, 6))
    assert torch.isfinite(out).all()
    assert (out - fused).abs().max().item() <= 1e-5


@pytest.mark.parametrize("mask_type", ["bool", "float"])
def test_off_cpu_masked_calls_never_read_tensor_values_on_the_host(mask_type):
    """On an accelerator, reading a mask's values would make the host wait at every call.
    Meta tensors have no values at all, so any such read raises."""
    block, _ = make_inputs()
    block = block.to("meta")
    x = torch.empty(3, 6, 8, device="meta")
    mask = padding_mask().to("meta") if mask_type == "bool" else torch.empty(
        3, 1, 1, 6, device="meta")
    with attnaudit.capture(block) as cap:
        out = block(x, attn_mask=mask)
    assert out.shape == (3, 2, 6, 4) and out.device.type == "meta"
    assert cap.records["forward"].weights.shape == (3, 2, 6, 6)

def test_uniform_edit_equals_mean_of_eligible_values():
    block, x = make_inputs()
    allowed = padding_mask()

    def uniform(site, weights, key_mask):
        eligible = key_mask.expand_as(weights).to(weights.dtype)
        return eligible / eligible.sum(-1, keepdim=True)

    with attnaudit.capture(block, edit=uniform):
        out = block(x, attn_mask=allowed)
    _, _, v = block.split(x)
    lengths = allowed[:, 0, 0].sum(-1)
    ref = torch.stack([v[b, :, : lengths[b]].mean(1, keepdim=True).expand(2, 6, 4)
                       for b in range(3)])
    assert (out - ref).abs().max().item() <= 1e-5


def test_values_kept_on_request():
    block, x = make_inputs()
    with attnaudit.capture(block, values=True) as cap:
        block(x)
    _, _, v = block.split(x)
    assert torch.equal(cap.records["forward"].values, v.detach())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_matches_fused(dtype):
    block, x = make_inputs()
    block = block.to(dtype)
    x = x.to(dtype)
    fused = block(x, attn_mask=padding_mask())
    with attnaudit.capture(block) as cap:
        out = block(x, attn_mask=padding_mask())
    assert cap.records["forward"].weights.dtype == dtype
    assert (out.float() - fused.float()).abs().max().item() <= 1e-2


@pytest.mark.parametrize("edit", [False, True])
def test_grouped_query_call_equals_attention_over_repeated_keys(edit):
    """``enable_gqa``: 4 query heads over 2 key/value heads. The recorded weights are those
    over each head's repeated keys, the output the fused kernel's, and a uniform edit reads
    the mean of the head's own group's values."""
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 4, 5, 8), torch.randn(3, 2, 6, 8), torch.randn(3, 2, 6, 8)
    allowed = torch.ones(3, 1, 1, 6, dtype=torch.bool)
    allowed[1, ..., 4:] = False
    k4, v4 = (t.repeat_interleave(2, dim=1) for t in (k, v))

    class Grouped(nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=True)

    def uniform(site, weights, key_mask):
        eligible = key_mask.expand_as(weights).to(weights.dtype)
        return eligible / eligible.sum(-1, keepdim=True)

    model = Grouped()
    with torch.no_grad(), attnaudit.capture(model, edit=uniform if edit else None) as cap:
        out = model(q, k, v)
    expected_weights = reference_weights(q, k4, allowed=allowed)
    torch.testing.assert_close(cap.records["forward"].weights, expected_weights,
                               rtol=1e-5, atol=1e-6)
    if edit:
        lengths = allowed[:, 0, 0].sum(-1)
        expected = torch.stack([v4[b, :, : lengths[b]].mean(1, keepdim=True).expand(4, 5, 8)
                                for b in range(3)])
    else:
        expected = expected_weights @ v4
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
