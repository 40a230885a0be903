"""Captum attributions against gradients and integrals computed here with plain autograd."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from attnaudit.attribution.inputs import resolve_pad_id
from attnaudit.attribution.methods import attribute
from attnaudit.errors import InterventionError, SiteNotFound
from attnaudit.targets.contract import Batch
from tests.helpers.fingerprints import assert_unchanged, model_fingerprint
from tests.helpers.toys.attention import (
    DIM,
    EOS,
    PAD,
    VOCAB,
    TinyAttention,
    decoder_inputs,
    tiny_target,
)


def step_probability(model: TinyAttention, embedded: torch.Tensor, batch: Batch,
                     emitted: torch.Tensor, b: int, t: int) -> torch.Tensor:
    """p(emitted[b, t]) for embeddings (k, n, d) of example b: (k,)."""
    k = embedded.shape[0]
    logits = model.from_embedding(embedded, batch.source_mask[b : b + 1].expand(k, -1),
                                  decoder_inputs(emitted)[b : b + 1].expand(k, -1))
    return torch.softmax(logits[:, t], -1)[:, emitted[b, t]]


def reference_gradients(model: TinyAttention, batch: Batch, emitted: torch.Tensor,
                        at: torch.Tensor) -> torch.Tensor:
    """d p(emitted[b, t]) / d embedding at ``at`` (B, n, d), per (b, t): (B, T, n, d)."""
    grads = torch.zeros(*emitted.shape, *at.shape[1:])
    for b in range(emitted.shape[0]):
        for t in range(emitted.shape[1]):
            leaf = at[b : b + 1].clone().requires_grad_()
            (grads[b, t],) = torch.autograd.grad(
                step_probability(model, leaf, batch, emitted, b, t).sum(), leaf)
    return grads


def reference_ig(model: TinyAttention, batch: Batch, emitted: torch.Tensor, x: torch.Tensor,
                 base: torch.Tensor, intervals: int = 500) -> torch.Tensor:
    """Integrated gradients by the trapezoid rule on a fine grid, summed over d: (B, T, n)."""
    alphas = torch.linspace(0, 1, intervals + 1, dtype=torch.float64)
    weights = torch.full_like(alphas, 1.0 / intervals)
    weights[[0, -1]] /= 2
    out = torch.zeros(*emitted.shape, x.shape[1])
    model.double()
    try:
        for b in range(emitted.shape[0]):
            for t in range(emitted.shape[1]):
                x_b, base_b = x[b].double(), base[b].double()
                path = (base_b + alphas[:, None, None] * (x_b - base_b)).requires_grad_()
                (grads,) = torch.autograd.grad(
                    step_probability(model, path, batch, emitted, b, t).sum(), path)
                integral = (weights[:, None, None] * grads).sum(0)
                out[b, t] = ((x_b - base_b) * integral).sum(-1).float()
    finally:
        model.float()
    return out


def normalised(scores: torch.Tensor, keys: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    mass = scores.abs() * keys[:, None, :] * steps[:, :, None]
    return mass / mass.sum(-1, keepdim=True).clamp_min(1e-30)


@pytest.mark.parametrize("shared", [False, True])
def test_gradient_methods_match_autograd(shared: bool) -> None:
    model = TinyAttention(shared=shared)
    target, batch, emitted = tiny_target(model)
    before = model_fingerprint(model)
    result = attribute(target, batch, emitted, ("saliency", "input_x_gradient"),
                       detach_attention=())
    assert_unchanged(model, before)
    with torch.no_grad():
        x = model.embed(batch.source_ids)
    grads = reference_gradients(model, batch, emitted, x)
    steps = target.step_mask(emitted)
    mask = steps[:, :, None]
    torch.testing.assert_close(result.token_scores["saliency"], grads.norm(dim=-1) * mask)
    ixg = (grads * x[:, None]).sum(-1) * mask
    torch.testing.assert_close(result.token_scores["input_x_gradient"], ixg)
    keys = batch.source_mask
    torch.testing.assert_close(result.importance["input_x_gradient"],
                               normalised(ixg, keys, steps))
    assert not steps[2, 2:].any() and result.importance["saliency"][2, 2:].eq(0).all()
    assert result.detached == ()
    frame = result.to_frame()  # one row per method x valid step x eligible key
    valid = steps[:, :, None] & keys[:, None, :]
    assert len(frame) == 2 * int(valid.sum())
    ixg_rows = frame[frame.method == "input_x_gradient"]
    for row in ixg_rows.sample(5, random_state=0).itertuples():
        at = (row.example, row.step, row.key)
        assert valid[at]
        assert row.token_score == float(result.token_scores["input_x_gradient"][at])
        assert row.importance == float(result.importance["input_x_gradient"][at])


def test_detached_attention_is_the_default_for_gradient_methods() -> None:
    model = TinyAttention()
    target, batch, emitted = tiny_target(model)
    before = model_fingerprint(model)
    result = attribute(target, batch, emitted, ("input_x_gradient",))
    assert_unchanged(model, before)
    with torch.no_grad():
        x = model.embed(batch.source_ids)
    model.detach_weights = True
    detached = (reference_gradients(model, batch, emitted, x) * x[:, None]).sum(-1)
    model.detach_weights = False
    full = (reference_gradients(model, batch, emitted, x) * x[:, None]).sum(-1)
    mask = target.step_mask(emitted)[:, :, None]
    torch.testing.assert_close(result.token_scores["input_x_gradient"], detached * mask)
    assert not torch.allclose(detached * mask, full * mask, atol=1e-4)
    assert result.detached == ("input_x_gradient",)


@pytest.mark.parametrize("shared", [False, True])
def test_integrated_gradients_match_a_fine_trapezoid_integral(shared: bool) -> None:
    model = TinyAttention(shared=shared)
    target, batch, emitted = tiny_target(model)
    before = model_fingerprint(model)
    result = attribute(target, batch, emitted, ("integrated_gradients",), n_steps=50,
                       internal_batch_size=7)  # several Captum batches and row chunks
    assert_unchanged(model, before)
    with torch.no_grad():
        x = model.embed(batch.source_ids)
        base = model.embed(torch.full_like(batch.source_ids, PAD))
    steps = target.step_mask(emitted)
    expected = reference_ig(model, batch, emitted, x, base) * steps[:, :, None]
    scores = result.token_scores["integrated_gradients"]
    torch.testing.assert_close(scores, expected, atol=2e-6, rtol=1e-4)
    # Completeness: scores sum to p(x) - p(baseline), varying the encoder-side embedding only.
    with torch.no_grad():
        gap = torch.zeros(emitted.shape)
        for b, t in steps.nonzero().tolist():
            ends = torch.stack([x[b], base[b]])
            p_x, p_base = step_probability(model, ends, batch, emitted, b, t)
            gap[b, t] = p_x - p_base
    torch.testing.assert_close(scores.sum(-1), gap, atol=1e-5, rtol=0)
    torch.testing.assert_close(result.convergence_delta, (scores.sum(-1) - gap) * steps,
                               atol=1e-6, rtol=0)
    assert result.baseline_id == PAD and result.detached == ()


def test_hooks_removed_and_model_unchanged_when_the_forward_raises() -> None:
    model = TinyAttention(shared=True)
    target, batch, emitted = tiny_target(model)
    calls = []

    def flaky(b: Batch, em: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("boom")
        return model(b.source_ids, b.source_mask, decoder_inputs(em))

    before = model_fingerprint(model)
    with pytest.raises(RuntimeError, match="boom"):
        attribute(target.with_options(teacher_forced=flaky), batch, emitted)
    assert_unchanged(model, before)


def test_bad_inputs_give_clear_errors() -> None:
    model = TinyAttention()
    target, batch, emitted = tiny_target(model)
    with pytest.raises(ValueError, match="methods must be among"):
        attribute(target, batch, emitted, ("lime",))
    with pytest.raises(ValueError, match="emitted must be long"):
        attribute(target, batch, emitted.float())
    with pytest.raises(InterventionError, match="source_embedding"):
        attribute(target.with_options(source_embedding=None), batch, emitted)
    unused = nn.Embedding(VOCAB, DIM)
    before = model_fingerprint(unused)
    with pytest.raises(InterventionError, match="was not called"):
        attribute(target.with_options(source_embedding=unused), batch, emitted)
    assert_unchanged(unused, before)
    full = batch.select([0])  # no padding anywhere, two special ids: the pad id is unknown
    with pytest.raises(InterventionError, match="pass pad_id"):
        resolve_pad_id(target.with_options(special_ids=(PAD, EOS)), full)
    assert resolve_pad_id(target, full) == PAD
    no_attention = target.with_options(kinds=None, sites=["nowhere"])
    with pytest.raises(SiteNotFound, match="nowhere"):
        attribute(no_attention, batch, emitted, ("saliency",))


def date_probabilities(model: nn.Module, src: torch.Tensor, lengths: torch.Tensor,
                       embedded: torch.Tensor, emitted: torch.Tensor,
                       detach: bool) -> torch.Tensor:
    """The date model's teacher-forced step probabilities (B, T, V), rewritten from its
    architecture so the source embedding is an argument and the attention can be detached."""
    packed = pack_padded_sequence(embedded, lengths, batch_first=True, enforce_sorted=False)
    out, (h, c) = model.encoder(packed)
    memory, _ = pad_packed_sequence(out, batch_first=True, total_length=src.shape[1])
    keys, h, c = model.key_proj(memory), h[0], c[0]
    probs = []
    for prev in decoder_inputs(emitted).T:
        feats = torch.tanh(keys + model.query_proj(h)[:, None, :])
        scores = model.score_vec(feats).squeeze(-1).masked_fill(src == 0, float("-inf"))
        weights = torch.softmax(scores, -1)
        weights = weights.detach() if detach else weights
        context = (weights[:, None, :] @ memory).squeeze(1)
        h, c = model.decoder(torch.cat([model.tgt_embed(prev), context], -1), (h, c))
        probs.append(torch.softmax(model.out(torch.cat([h, context], -1)), -1))
    return torch.stack(probs, 1)


def test_date_model_matches_its_rewritten_forward() -> None:
    from attnaudit_examples.date.target import make_target

    target = make_target(limit=2)
    batch = next(target.iter_batches())
    model = target.model
    emitted = target.greedy(batch)
    before = model_fingerprint(model)
    # 8 integration points: completeness (scores - delta = gap) holds for any number
    result = attribute(target, batch, emitted, ("input_x_gradient", "integrated_gradients"),
                       n_steps=8)
    assert_unchanged(model, before)
    src, lengths = batch.source_ids, batch.inputs["lengths"]
    with torch.no_grad():
        x = model.src_embed(src)
    index = emitted[:, :, None]
    expected = torch.zeros(result.token_scores["input_x_gradient"].shape)
    for t in range(emitted.shape[1]):
        leaf = x.clone().requires_grad_()
        p = date_probabilities(model, src, lengths, leaf, emitted, detach=True)
        (grad,) = torch.autograd.grad(p.gather(-1, index)[:, t].sum(), leaf)
        expected[:, t] = (grad * x).sum(-1)
    torch.testing.assert_close(result.token_scores["input_x_gradient"], expected,
                               atol=1e-6, rtol=1e-4)
    with torch.no_grad():  # the pad embedding (padding_idx) is the zero vector
        gap = (date_probabilities(model, src, lengths, x, emitted, False)
               - date_probabilities(model, src, lengths, torch.zeros_like(x), emitted, False))
    gap = gap.gather(-1, index).squeeze(-1)
    ig = result.token_scores["integrated_gradients"].sum(-1)
    torch.testing.assert_close(ig - result.convergence_delta, gap, atol=1e-5, rtol=0)
    assert result.keys.equal(batch.source_mask) and result.steps.all()


def test_date_transformer_attributes_at_the_encoder_embedding_only() -> None:
    from attnaudit_examples.date_transformer.target import make_target

    target = make_target()
    batch = next(target.iter_batches(limit=100)).select([5])
    model = target.model
    emitted = target.greedy(batch)
    before = model_fingerprint(model)
    result = attribute(target, batch, emitted, ("input_x_gradient", "integrated_gradients"),
                       n_steps=8, detach_attention=())
    detached = attribute(target, batch, emitted, ("input_x_gradient",))
    assert_unchanged(model, before)
    config = model.config
    steps = target.step_mask(emitted)
    decoder_ids = torch.cat([torch.full_like(emitted[:, :1], config.decoder_start_token_id),
                             emitted[:, :-1]], 1)

    def probs(embeds: torch.Tensor) -> torch.Tensor:
        logits = model(inputs_embeds=embeds, attention_mask=batch.source_mask.long(),
                       decoder_input_ids=decoder_ids, use_cache=False).logits
        return torch.softmax(logits, -1).gather(-1, emitted[:, :, None]).squeeze(-1)

    encoder_embed = model.get_encoder().get_input_embeddings()
    with torch.no_grad():
        x = encoder_embed(batch.source_ids)
        base = encoder_embed(torch.full_like(batch.source_ids, config.pad_token_id))
    expected = torch.zeros(result.token_scores["input_x_gradient"].shape)
    for t in range(emitted.shape[1]):
        leaf = x.clone().requires_grad_()
        (grad,) = torch.autograd.grad(probs(leaf)[:, t].sum(), leaf)
        expected[:, t] = (grad * x).sum(-1)
    mask = steps[:, :, None]
    torch.testing.assert_close(result.token_scores["input_x_gradient"], expected * mask,
                               atol=1e-6, rtol=1e-4)
    assert not torch.allclose(detached.token_scores["input_x_gradient"], expected * mask,
                              atol=1e-4)
    with torch.no_grad():
        gap = (probs(x) - probs(base)) * steps
    ig = result.token_scores["integrated_gradients"].sum(-1)
    torch.testing.assert_close(ig - result.convergence_delta, gap, atol=1e-5, rtol=0)
    assert result.baseline_id == config.pad_token_id


def completeness_gap(model: TinyAttention, batch: Batch, emitted: torch.Tensor,
                     x: torch.Tensor, base: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """p(emitted | x) - p(emitted | baseline) per counted (example, step): (B, T)."""
    gap = torch.zeros(emitted.shape)
    with torch.no_grad():
        for b, t in steps.nonzero().tolist():
            p_x, p_base = step_probability(model, torch.stack([x[b], base[b]]), batch,
                                           emitted, b, t)
            gap[b, t] = p_x - p_base
    return gap


@pytest.mark.parametrize("reduction", ["sum", "norm"])
def test_the_convergence_delta_is_signed_whatever_the_token_reduction(reduction: str) -> None:
    """The delta is how far the signed attributions miss p(x) - p(baseline); reducing each
    token's scores to a norm for display does not change it."""
    model = TinyAttention()
    target, batch, emitted = tiny_target(model)
    result = attribute(target, batch, emitted, ("integrated_gradients",), n_steps=50,
                       reduction=reduction)
    with torch.no_grad():
        x = model.embed(batch.source_ids)
        base = model.embed(torch.full_like(batch.source_ids, PAD))
    steps = target.step_mask(emitted)
    signed = reference_ig(model, batch, emitted, x, base) * steps[:, :, None]
    expected = (signed.sum(-1) - completeness_gap(model, batch, emitted, x, base, steps)) * steps
    torch.testing.assert_close(result.convergence_delta, expected, atol=2e-6, rtol=0)
    if reduction == "norm":
        assert (result.token_scores["integrated_gradients"] >= 0).all()


def test_the_unk_baseline_keeps_the_end_of_sequence_token() -> None:
    """inseq's ``unk`` baseline: the unknown token everywhere but where the input has the
    end-of-sequence token, which the baseline keeps, so that token's integrated gradients
    and occlusion are 0 and the rest follow the baseline built by hand."""
    model = TinyAttention()
    target, batch, emitted = tiny_target(model)
    src = batch.source_ids.clone()
    src[0, 3], src[1, 2] = EOS, EOS
    batch = Batch(src, src != PAD, batch.texts)
    unk = 1
    target = target.with_options(batches=lambda: [batch], unk_id=unk)
    result = attribute(target, batch, emitted, ("integrated_gradients", "occlusion"),
                       baseline="unk", n_steps=50)
    eos = src == EOS
    steps = target.step_mask(emitted)
    # 0 by construction for IG (x - baseline is 0 there); occlusion compares two forward
    # passes of equal inputs in different batches, equal up to rounding
    for method, tolerance in (("integrated_gradients", 0.0), ("occlusion", 1e-6)):
        scores = result.token_scores[method]
        assert scores.permute(0, 2, 1)[eos].abs().max() <= tolerance, method
        assert (scores * steps[:, :, None]).abs()[:, :, ~eos[0]].sum() > 0
    with torch.no_grad():
        x = model.embed(src)
        base = model.embed(torch.where(eos, src, torch.full_like(src, unk)))
    expected = reference_ig(model, batch, emitted, x, base) * steps[:, :, None]
    torch.testing.assert_close(result.token_scores["integrated_gradients"], expected,
                               atol=2e-6, rtol=1e-4)
    assert result.baseline_id == unk
