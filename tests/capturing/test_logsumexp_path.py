"""Attention written as ``exp(scores - logsumexp(scores))`` with no softmax call is found,
recorded and edited like a softmax; a log-sum-exp that feeds anything else (a z-loss, an
``exp`` of other numbers) is not attention. Checked on a hand-built toy against a
hand-written softmax, and on a tiny Reformer (local and LSH layers) against its own eager
``output_attentions``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import attnaudit
from attnaudit.errors import NoAttentionFound

B, H, T, D = 2, 3, 6, 4


class LseAttention(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = q @ k.transpose(-1, -2)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        scores = torch.where(causal, scores, torch.tensor(-1e9))
        logits = torch.logsumexp(scores, dim=-1, keepdim=True)
        return torch.exp(scores - logits) @ v


class ZLoss(nn.Module):
    """A log-sum-exp read as a loss, and an ``exp`` of other numbers of the same shape."""

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        z = logits.logsumexp(-1).pow(2).mean()
        return (logits * 0.5).exp().sum() + z


def hand_softmax(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    scores = q @ k.transpose(-1, -2)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    e = torch.exp(scores - scores.max(-1, keepdim=True).values) * causal
    return e / e.sum(-1, keepdim=True)


def test_exp_of_scores_less_their_logsumexp_is_found_and_edited():
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, dtype=torch.float64) for _ in range(3))
    model = LseAttention()
    with torch.no_grad(), attnaudit.capture(model) as cap:
        model(q, k, v)
    rec = cap.records["forward"]
    torch.testing.assert_close(rec.weights, hand_softmax(q, k), rtol=0, atol=1e-12)
    assert not rec.key_mask[0, 0, 0, 1:].any() and rec.key_mask[0, 0, -1].all()

    def uniform(site, weights, key_mask):
        eligible = key_mask.expand_as(weights).to(weights.dtype)
        return eligible / eligible.sum(-1, keepdim=True)

    with torch.no_grad(), attnaudit.capture(model, edit=uniform):
        out = model(q, k, v)
    causal = torch.ones(T, T, dtype=torch.float64).tril()
    torch.testing.assert_close(out, causal / causal.sum(-1, keepdim=True) @ v, rtol=0,
                               atol=1e-12)


def test_a_logsumexp_that_is_no_softmax_is_not_attention():
    model = ZLoss()
    logits = torch.randn(B, T, 5)
    with pytest.raises(NoAttentionFound), attnaudit.capture(model):
        model(logits)
    assert torch.exp(torch.zeros(1)).item() == 1.0  # exp restored after the capture


transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("kind", ["local", "lsh"])
def test_reformer_attention_equals_eager(kind):
    config = transformers.ReformerConfig(
        vocab_size=50, hidden_size=16, attention_head_size=4, num_attention_heads=4,
        attn_layers=[kind, kind], feed_forward_size=32, is_decoder=True,
        local_attn_chunk_length=16, lsh_attn_chunk_length=16, num_buckets=2, num_hashes=1,
        axial_pos_embds=False, max_position_embeddings=32, pad_token_id=0, eos_token_id=2)
    torch.manual_seed(0)
    model = transformers.ReformerModelWithLMHead(config).eval()
    ids = torch.randint(3, 50, (2, 7))
    with torch.no_grad():
        truth = model(input_ids=ids, output_attentions=True).attentions
        with attnaudit.capture(model) as cap:
            model(input_ids=ids)
    assert len(cap.records) == 2
    for rec, expected in zip(cap.records.values(), truth, strict=True):
        assert rec.kind == "self" and rec.weights.shape == expected.shape == (2, 4, 7, 7)
        torch.testing.assert_close(rec.weights, expected, rtol=0, atol=1e-5)
