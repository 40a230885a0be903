"""Sink columns: learned logits concatenated to the scores before the softmax (GPT-OSS)
are recorded as the record's ``sink``, not as keys: the weights have the K real keys, a
row's keys plus its sink sum to one (the numerics analyser counts it), prompt views leave
the sink out of their key axis and start on the right row, and an edit of the keys leaves
the sink column as the model computed it. Checked on a hand-built toy against numpy and on
a tiny GPT-OSS against its own eager ``output_attentions``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import attnaudit
from attnaudit.analysis.numerics import NumericsAnalyser
from attnaudit.capturing.views import prompt_views

B, H, T, D, P = 2, 3, 7, 4, 5


class SinkAttention(nn.Module):
    """Causal attention with one learned sink logit per head, as GPT-OSS computes it."""

    def __init__(self) -> None:
        super().__init__()
        self.sinks = nn.Parameter(torch.tensor([3.0, -1.0, 0.5]))

    def forward(self, query: torch.Tensor, key: torch.Tensor,
                value_states: torch.Tensor) -> torch.Tensor:
        scores = query @ key.transpose(-1, -2)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, torch.finfo(scores.dtype).min)
        sinks = self.sinks.reshape(1, -1, 1, 1).expand(B, -1, T, -1)
        probs = torch.softmax(torch.cat([scores, sinks], dim=-1), dim=-1)
        return probs[..., :-1] @ value_states


def numpy_weights(q: np.ndarray, k: np.ndarray, sinks: np.ndarray) -> np.ndarray:
    """(B, H, T, T + 1): softmax over the keys and the sink, in float64."""
    scores = q @ k.transpose(0, 1, 3, 2)
    scores = np.where(np.tril(np.ones((T, T), bool)), scores, -np.inf)
    logits = np.concatenate([scores, np.broadcast_to(sinks[None, :, None, None],
                                                     (B, H, T, 1))], -1)
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_a_sink_column_is_recorded_as_the_sink_not_as_a_key():
    torch.manual_seed(0)
    model = SinkAttention()
    q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
    truth = numpy_weights(q.double().numpy(), k.double().numpy(),
                          model.sinks.detach().double().numpy())
    with torch.no_grad(), attnaudit.capture(model) as cap:
        model(q, k, v)
    rec = cap.records["forward"]
    assert rec.weights.shape == (B, H, T, T)
    np.testing.assert_allclose(rec.weights.double().numpy(), truth[..., :T], atol=1e-6)
    np.testing.assert_allclose(rec.sink.double().numpy(), truth[..., T:], atol=1e-6)
    assert truth[..., T:].max() > 0.5  # the sink holds much of some rows
    analyser = NumericsAnalyser()
    analyser.update(rec)
    table = analyser.compute()
    assert table.query("metric == 'row_sum_rows'")["sum"].sum() == 0

    with torch.no_grad(), prompt_views(P), attnaudit.capture(model) as views:
        model(q, k, v)
    rows = truth[:, :, P - 1:]
    keys = rows[..., :T].sum(-1, keepdims=True)
    for kind, cut in (("cross", slice(0, P)), ("self", slice(P - 1, T))):
        view = views.records[f"forward:{kind}"]
        block = rows[..., cut]
        expected = block / block.sum(-1, keepdims=True) * keys
        np.testing.assert_allclose(view.weights.double().numpy(), expected, atol=1e-6)
        np.testing.assert_allclose(view.sink.double().numpy(), rows[..., T:], atol=1e-6)


def test_an_edit_of_the_keys_keeps_the_sink_column():
    torch.manual_seed(1)
    model = SinkAttention()
    q, k, v = (torch.randn(B, H, T, D, dtype=torch.float64) for _ in range(3))
    truth = torch.from_numpy(numpy_weights(q.numpy(), k.numpy(),
                                           model.sinks.detach().double().numpy()))

    def halve(site, weights, key_mask):
        return weights / 2

    with torch.no_grad(), attnaudit.capture(model, edit=halve):
        out = model(q, k, v)
    torch.testing.assert_close(out, truth[..., :T] / 2 @ v, rtol=0, atol=1e-9)


transformers = pytest.importorskip("transformers")


def tiny_gpt_oss() -> nn.Module:
    config = transformers.GptOssConfig(
        vocab_size=50, hidden_size=16, intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=4, num_local_experts=4,
        num_experts_per_tok=2, max_position_embeddings=32, sliding_window=3,
        attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            nn.init.normal_(layer.self_attn.sinks, std=2.0)
    return model


def test_gpt_oss_sinks_equal_eager_and_views_start_on_the_prompts_last_row():
    model = tiny_gpt_oss()
    torch.manual_seed(2)
    ids = torch.randint(3, 50, (2, T))
    with torch.no_grad():
        truth = model(input_ids=ids, output_attentions=True).attentions  # the keys only
        with attnaudit.capture(model) as cap:
            model(input_ids=ids)
        with prompt_views(P), attnaudit.capture(model) as views:
            model(input_ids=ids)
    assert cap.sites == ["model.layers.0.self_attn:self", "model.layers.1.self_attn:self"]
    for rec, expected in zip(cap.records.values(), truth, strict=True):
        assert rec.weights.shape == expected.shape == (2, 4, T, T)
        torch.testing.assert_close(rec.weights, expected, rtol=0, atol=1e-5)
        torch.testing.assert_close(rec.sink[..., 0], 1 - expected.double().sum(-1).float(),
                                   rtol=0, atol=1e-5)
    for layer, expected in enumerate(truth):
        rows = expected[:, :, P - 1:].double()
        cross = rows[..., :P] / rows[..., :P].sum(-1, keepdim=True) * rows.sum(-1, keepdim=True)
        view = views.records[f"model.layers.{layer}.self_attn:cross"]
        assert view.weights.shape == (2, 4, T - P + 1, P)
        torch.testing.assert_close(view.weights.double(), cross, rtol=0, atol=1e-5)
        torch.testing.assert_close(view.sink[..., 0].double(), 1 - rows.sum(-1), rtol=0,
                                   atol=1e-5)
