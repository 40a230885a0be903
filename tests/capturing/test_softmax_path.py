"""Softmax adapter: attention written as softmax(scores), including the date model's
plain ``attend`` method called from its own step loop."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.functional import softmax as imported_softmax

import attnaudit
from attnaudit_examples.date.data import BOS


def reference_date_attention(model, src, lengths, tgt_in, uniform=False):
    """Hand-written additive attention loop over the model's parameters.

    Returns per-step weights (B, T, n) and teacher-forced logits (B, T, V).
    """
    memory, valid, (h, c) = model.encode(src, lengths)
    keys = memory @ model.key_proj.weight.T
    weights, logits = [], []
    for t in range(tgt_in.shape[1]):
        if uniform:
            w = valid.float() / valid.sum(-1, keepdim=True)
        else:
            q = h @ model.query_proj.weight.T
            scores = (torch.tanh(keys + q[:, None]) @ model.score_vec.weight.T).squeeze(-1)
            scores = scores.masked_fill(~valid, float("-inf"))
            e = torch.exp(scores - scores.max(-1, keepdim=True).values)
            w = e / e.sum(-1, keepdim=True)
        context = (w[:, :, None] * memory).sum(1)
        x = torch.cat([model.tgt_embed(tgt_in[:, t]), context], -1)
        h, c = model.decoder(x, (h, c))
        logits.append(model.out(torch.cat([h, context], -1)))
        weights.append(w)
    return torch.stack(weights, 1), torch.stack(logits, 1)


def greedy_inputs(model, src, lengths):
    emitted = model.greedy(src, lengths)
    bos = torch.full((src.shape[0], 1), BOS)
    return torch.cat([bos, emitted[:, :-1]], 1)


@pytest.mark.parametrize("grad", [False, True])
def test_date_model_weights_match_hand_written_attention(date_model, date_batch, grad):
    src, lengths, _ = date_batch
    tgt_in = greedy_inputs(date_model, src, lengths)
    with torch.set_grad_enabled(grad):
        with attnaudit.capture(date_model) as cap:
            logits = date_model(src, lengths, tgt_in)
        ref_w, ref_logits = reference_date_attention(date_model, src, lengths, tgt_in)
    assert cap.sites == ["attend"]
    rec = cap.records["attend"]
    assert rec.weights.shape == (64, 1, 11, src.shape[1])
    assert len(rec.calls) == 11
    assert (rec.weights[:, 0] - ref_w).abs().max().item() <= 1e-5
    assert (logits - ref_logits).abs().max().item() <= 1e-5
    expected_mask = torch.arange(src.shape[1])[None, :] < lengths[:, None]
    assert torch.equal(rec.key_mask[:, 0, 0], expected_mask)
    assert logits.requires_grad == grad


def test_greedy_loop_stacks_steps_in_call_order(date_model, date_batch):
    src, lengths, _ = date_batch
    with torch.no_grad(), attnaudit.capture(date_model) as cap:
        date_model.greedy(src, lengths)
    rec = cap.records["attend"]
    for step, call in enumerate(rec.calls):
        assert torch.equal(rec.weights[:, :, step:step + 1], call.weights)


def test_gradients_flow_through_captured_weights(date_model, date_batch):
    src, lengths, _ = date_batch
    tgt_in = greedy_inputs(date_model, src, lengths)
    date_model.zero_grad()
    date_model(src, lengths, tgt_in).logsumexp(-1).sum().backward()
    plain = {n: p.grad.clone() for n, p in date_model.named_parameters()}
    date_model.zero_grad()
    with attnaudit.capture(date_model):
        date_model(src, lengths, tgt_in).logsumexp(-1).sum().backward()
    for name, p in date_model.named_parameters():
        assert torch.allclose(p.grad, plain[name], atol=1e-6), name


def uniform_edit(site, weights, key_mask):
    eligible = key_mask.expand_as(weights).to(weights.dtype)
    return eligible / eligible.sum(-1, keepdim=True)


def test_uniform_edit_equals_hand_written_uniform_forward(date_model, date_batch):
    src, lengths, _ = date_batch
    tgt_in = greedy_inputs(date_model, src, lengths)
    with torch.no_grad():
        with attnaudit.capture(date_model, edit=uniform_edit) as cap:
            edited = date_model(src, lengths, tgt_in)
        _, ref_logits = reference_date_attention(date_model, src, lengths, tgt_in, uniform=True)
        original = date_model(src, lengths, tgt_in)
    assert (edited - ref_logits).abs().max().item() <= 1e-5
    assert (edited - original).abs().max().item() > 1e-2  # the edit really changed the model
    # records keep what the model computed, not what the edit returned
    assert cap.records["attend"].weights.max() > 0.5


def test_edit_sees_call_index_and_query_offset(date_model, date_batch):
    src, lengths, _ = date_batch
    seen = []

    def spy(site, weights, key_mask):
        seen.append((site.name, site.call, site.query_offset, tuple(weights.shape)))
        return weights

    with torch.no_grad(), attnaudit.capture(date_model, edit=spy):
        date_model.greedy(src, lengths, steps=3)
    n = src.shape[1]
    assert seen == [("attend", t, t, (64, 1, 1, n)) for t in range(3)]


class ThreeSoftmaxes(nn.Module):
    """Scaled dot-product attention written three ways, plus a non-attention log_softmax."""

    def __init__(self, style: str) -> None:
        super().__init__()
        self.style = style
        self.q = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        scores = self.q(x) @ x.transpose(1, 2) / 8**0.5
        scores = scores.masked_fill(~valid[:, None, :], -1e9)
        if self.style == "method":
            w = scores.softmax(-1)
        elif self.style == "functional":
            w = F.softmax(scores, dim=-1)
        else:
            w = imported_softmax(scores, -1)
        return (w @ x).log_softmax(-1)


@pytest.mark.parametrize("style", ["method", "functional", "imported"])
def test_every_softmax_spelling_is_captured(style):
    torch.manual_seed(0)
    model = ThreeSoftmaxes(style)
    x = torch.randn(3, 5, 8)
    valid = torch.ones(3, 5, dtype=torch.bool)
    valid[2, 3:] = False
    with attnaudit.capture(model) as cap:
        out = model(x, valid)
    scores = (x @ model.q.weight.T + model.q.bias) @ x.transpose(1, 2) / 8**0.5
    scores[~valid[:, None, :].expand_as(scores)] = float("-inf")
    ref = torch.exp(scores - scores.amax(-1, keepdim=True))
    ref = ref / ref.sum(-1, keepdim=True)
    assert list(cap.records) == ["forward"]
    rec = cap.records["forward"]
    assert (rec.weights[:, 0] - ref).abs().max().item() <= 1e-5
    assert torch.equal(rec.key_mask[:, 0], valid[:, None, :].expand(3, 5, 5))
    assert torch.allclose(out, model(x, valid))


def test_kinds_can_be_declared(date_model, date_batch):
    src, lengths, _ = date_batch
    with torch.no_grad(), attnaudit.capture(date_model, kinds={"attend": "cross"}) as cap:
        date_model.greedy(src, lengths, steps=2)
    assert cap.sites == ["attend:cross"]
    assert cap.records["attend:cross"].kind == "cross"


def test_scores_kept_on_request(date_model, date_batch):
    src, lengths, _ = date_batch
    with torch.no_grad(), attnaudit.capture(date_model, scores=True) as cap:
        date_model.greedy(src, lengths, steps=2)
    rec = cap.records["attend"]
    assert torch.allclose(rec.scores.softmax(-1), rec.weights, atol=1e-6)
