"""Norm-based contributions (Kobayashi et al.) at an ``nn.MultiheadAttention`` site, whose
values capture now keeps, against numpy from the module's parameters: ``‖a^h_ij v^h_j W_o^h‖``
per head and ``‖Σ_h a^h_ij v^h_j W_o^h‖``. torch calls the output projection inside the
functional, so it is declared (``projections=``); undeclared, the measure says why."""

from __future__ import annotations

import numpy as np

from attnaudit.contributions import contributions
from tests.helpers.toys.mha_seq2seq import BOS, DIM, HEADS, mha_target

SITE = "attn:cross"


def _numpy_reference(model, batch, emitted) -> tuple[np.ndarray, np.ndarray]:
    """(B, H, T, n) per-head and (B, T, n) summed norms, float64."""
    p = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    src, valid = batch.source_ids.numpy(), batch.source_mask.numpy()
    tgt_in = np.concatenate([np.full((len(emitted), 1), BOS), emitted[:, :-1].numpy()], 1)
    w_q, w_k, w_v = np.split(p["attn.in_proj_weight"], 3)
    b_q, b_k, b_v = np.split(p["attn.in_proj_bias"], 3)
    memory = np.tanh(p["embed.weight"][src] @ p["enc.weight"].T + p["enc.bias"])
    query = np.tanh(p["tgt_embed.weight"][tgt_in])
    d = DIM // HEADS

    def heads(x: np.ndarray) -> np.ndarray:  # (B, L, D) -> (B, H, L, d)
        return x.reshape(*x.shape[:2], HEADS, d).transpose(0, 2, 1, 3)

    q, k, v = heads(query @ w_q.T + b_q), heads(memory @ w_k.T + b_k), heads(memory @ w_v.T + b_v)
    scores = np.where(valid[:, None, None, :], q @ k.transpose(0, 1, 3, 2) / np.sqrt(d), -np.inf)
    a = np.exp(scores - scores.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    w_o = p["attn.out_proj.weight"]
    f = np.stack([v[:, h] @ w_o[:, h * d:(h + 1) * d].T for h in range(HEADS)], 1)  # (B,H,n,D)
    per_head = a * np.linalg.norm(f, axis=-1)[:, :, None, :]
    summed = np.linalg.norm((a[..., None] * f[:, :, None]).sum(1), axis=-1)
    return per_head, summed


def test_value_norms_at_a_multihead_attention_site_equal_numpy():
    target, model = mha_target()
    batch = next(iter(target.batches()))
    emitted = target.greedy(batch)
    found = contributions(target, batch, emitted, projections={SITE: model.attn.out_proj})
    per_head, summed = _numpy_reference(model, batch, emitted)
    norms = found.value_norms[SITE]
    np.testing.assert_allclose(norms.per_head.double().numpy(), per_head, atol=1e-5)
    np.testing.assert_allclose(norms.summed.double().numpy(), summed, atol=1e-5)


def test_an_undeclared_functional_output_projection_is_a_reason():
    target, _ = mha_target()
    batch = next(iter(target.batches()))
    found = contributions(target, batch, target.greedy(batch))
    assert SITE not in found.value_norms
    assert "projections=" in found.reasons[SITE]
