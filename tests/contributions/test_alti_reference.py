"""ALTI of a one-layer post-LN block (BART's encoder self-attention) and a one-layer pre-LN
block (GPT-2) against a hand-written numpy ALTI (Ferrando et al. 2022a) in float64: the
projections, softmax, residual and layer norm (with the module's own epsilon) computed from
the checkpoint's parameters, then max(0, ‖y‖₁ - ‖y - T_j‖₁) normalised over j."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnaudit.contributions import alti, contributions, measure_maps
from attnaudit.targets.hf.loading import from_hf

pytest.importorskip("transformers")

from tests.helpers.tiny_targets import NEW_TOKENS, SOURCES, save_tiny

TOL = 1e-5


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy()


def _layer_norm(z: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float
                ) -> tuple[np.ndarray, np.ndarray]:
    """(LN(z), sigma) over the last axis, as nn.LayerNorm computes it."""
    sigma = np.sqrt(z.var(-1, keepdims=True) + eps)
    return gamma * (z - z.mean(-1, keepdims=True)) / sigma + beta, sigma


def _softmax(scores: np.ndarray) -> np.ndarray:
    scores = scores - scores.max(-1, keepdims=True)
    e = np.exp(scores)
    return e / e.sum(-1, keepdims=True)


def _alti(y: np.ndarray, terms: np.ndarray) -> np.ndarray:
    """Contributions (Q, K) of terms (Q, K, d) to outputs y (Q, d)."""
    score = np.abs(y).sum(-1)[:, None] - np.abs(y[:, None] - terms).sum(-1)
    score = np.maximum(score, 0)
    return score / score.sum(-1, keepdims=True)


def _layer_input(model: torch.nn.Module, layer: torch.nn.Module, run) -> torch.Tensor:
    seen = []
    handle = layer.register_forward_pre_hook(lambda mod, args: seen.append(args[0]))
    try:
        with torch.no_grad():
            run()
    finally:
        handle.remove()
    return seen[0]


def _heads(x: np.ndarray, n: int) -> np.ndarray:
    """(L, n * d_h) -> (n, L, d_h)."""
    return x.reshape(x.shape[0], n, -1).transpose(1, 0, 2)


@pytest.mark.parametrize(("few_heads", "block"), [(alti.FEW_HEADS, alti.TERMS_BLOCK),
                                                  (0, alti.TERMS_BLOCK), (0, 1)],
                         ids=["per-head", "batched", "key-by-key"])
def test_post_ln_alti_equals_a_numpy_alti(tmp_path, monkeypatch, few_heads, block):
    # both ways of forming the per-key terms (head by head, one batched product), and terms
    # taken one key at a time (the blocks of a long sequence)
    monkeypatch.setattr(alti, "FEW_HEADS", few_heads)
    monkeypatch.setattr(alti, "TERMS_BLOCK", block)
    folder = save_tiny("bart", tmp_path, layers=1)
    target = from_hf(folder, SOURCES, max_new_tokens=NEW_TOKENS)
    batch = next(target.iter_batches())
    emitted = target.greedy(batch)
    result = contributions(target, batch, emitted)
    name = "model.encoder.layers.0.self_attn:self"
    layer = target.model.model.encoder.layers[0]
    x_all = _np(_layer_input(target.model, layer,
                             lambda: target.model.get_encoder()(
                                 input_ids=batch.source_ids,
                                 attention_mask=batch.source_mask.long())))
    attn, ln = layer.self_attn, layer.self_attn_layer_norm
    heads = attn.num_heads
    for b in range(len(batch)):
        real = batch.source_mask[b].numpy()
        x = x_all[b][real]  # (n, d), real tokens only
        q = _heads(x @ _np(attn.q_proj.weight).T + _np(attn.q_proj.bias), heads)
        k = _heads(x @ _np(attn.k_proj.weight).T + _np(attn.k_proj.bias), heads)
        v = _heads(x @ _np(attn.v_proj.weight).T + _np(attn.v_proj.bias), heads)
        weights = _softmax(q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1]))  # (H, n, n)
        w_o = _np(attn.out_proj.weight).T.reshape(heads, -1, x.shape[1])  # (H, d_h, d)
        f = np.einsum("hkv,hvd->hkd", v, w_o)
        terms = np.einsum("hqk,hkd->qkd", weights, f)
        terms[np.arange(len(x)), np.arange(len(x))] += x
        z = terms.sum(1) + _np(attn.out_proj.bias)
        gamma, beta = _np(ln.weight), _np(ln.bias)
        y, sigma = _layer_norm(z, gamma, beta, ln.eps)
        transformed = gamma * (terms - terms.mean(-1, keepdims=True)) / sigma[:, None]
        expected = _alti(y, transformed)
        got = result.blocks[name].contributions[b][real][:, real].double().numpy()
        np.testing.assert_allclose(got, expected, atol=TOL, rtol=0)


@pytest.mark.parametrize("block", [alti.TERMS_BLOCK, 3], ids=["whole", "key-blocks"])
def test_pre_ln_alti_equals_a_numpy_alti(tmp_path, monkeypatch, block):
    monkeypatch.setattr(alti, "TERMS_BLOCK", block)
    folder = save_tiny("gpt2", tmp_path, layers=1)
    target = from_hf(folder, SOURCES, max_new_tokens=NEW_TOKENS)
    batch = next(target.iter_batches())
    emitted = target.greedy(batch)
    result = contributions(target, batch, emitted)
    (name,) = result.blocks
    model = target.model
    block = model.transformer.h[0]
    prefix = emitted[:, :-1]
    ids = torch.cat([batch.source_ids, prefix], 1)
    mask = torch.cat([batch.source_mask, torch.ones_like(prefix, dtype=torch.bool)], 1)
    positions = (mask.long().cumsum(-1) - 1).clamp_min(0)
    x_all = _np(model.transformer.wte(ids) + model.transformer.wpe(positions))
    attn, ln = block.attn, block.ln_1
    heads, d = attn.num_heads, x_all.shape[-1]
    for b in range(len(batch)):
        real = mask[b].numpy()
        x = x_all[b][real]
        h, _ = _layer_norm(x, _np(ln.weight), _np(ln.bias), ln.eps)
        qkv = h @ _np(attn.c_attn.weight) + _np(attn.c_attn.bias)
        q, k, v = (_heads(qkv[:, i * d:(i + 1) * d], heads) for i in range(3))
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
        scores = np.where(np.tril(np.ones((len(x), len(x)), bool)), scores, -np.inf)
        weights = _softmax(scores)
        w_o = _np(attn.c_proj.weight).reshape(heads, -1, d)  # Conv1D: (in, out)
        terms = np.einsum("hqk,hkd->qkd", weights, np.einsum("hkv,hvd->hkd", v, w_o))
        terms[np.arange(len(x)), np.arange(len(x))] += x
        y = terms.sum(1) + _np(attn.c_proj.bias)
        expected = _alti(y, terms)
        got = result.blocks[name].contributions[b][real][:, real].double().numpy()
        np.testing.assert_allclose(got, expected, atol=TOL, rtol=0)


@pytest.mark.parametrize("block", [alti.TERMS_BLOCK, 1], ids=["whole", "key-by-key"])
def test_a_post_ln_cross_attention_block_equals_a_numpy_alti_with_the_stream_as_a_term(
        tmp_path, monkeypatch, block):
    monkeypatch.setattr(alti, "TERMS_BLOCK", block)
    folder = save_tiny("bart", tmp_path, layers=1)
    target = from_hf(folder, SOURCES, max_new_tokens=NEW_TOKENS)
    batch = next(target.iter_batches())
    emitted = target.greedy(batch)
    maps = measure_maps(target, batch, emitted, ["alti_layer"])
    layer = target.model.model.decoder.layers[0]
    attn, ln = layer.encoder_attn, layer.encoder_attn_layer_norm
    seen = {}

    def keep(mod, args, kwargs):
        seen["h"] = kwargs.get("hidden_states", args[0] if args else None)
        seen["e"] = kwargs["key_value_states"]

    handle = attn.register_forward_pre_hook(keep, with_kwargs=True)
    try:
        with torch.no_grad():
            target.teacher_forced(batch, emitted)
    finally:
        handle.remove()
    heads = attn.num_heads
    for b in range(len(batch)):
        real = batch.source_mask[b].numpy()
        h, e = _np(seen["h"][b]), _np(seen["e"][b])[real]
        q = _heads(h @ _np(attn.q_proj.weight).T + _np(attn.q_proj.bias), heads)
        k = _heads(e @ _np(attn.k_proj.weight).T + _np(attn.k_proj.bias), heads)
        v = _heads(e @ _np(attn.v_proj.weight).T + _np(attn.v_proj.bias), heads)
        weights = _softmax(q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1]))
        w_o = _np(attn.out_proj.weight).T.reshape(heads, -1, h.shape[1])
        terms = np.einsum("hqk,hkd->qkd", weights, np.einsum("hkv,hvd->hkd", v, w_o))
        terms = np.concatenate([terms, h[:, None]], axis=1)  # the decoder stream, last
        z = terms.sum(1) + _np(attn.out_proj.bias)
        gamma, beta = _np(ln.weight), _np(ln.bias)
        y, sigma = _layer_norm(z, gamma, beta, ln.eps)
        expected = _alti(y, gamma * (terms - terms.mean(-1, keepdims=True)) / sigma[:, None])
        got = maps["alti_layer"][b, 0][:, real].double().numpy()
        np.testing.assert_allclose(got, expected[:, :-1], atol=TOL, rtol=0)
