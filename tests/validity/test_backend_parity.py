"""Backend parity: on sampled calls the deployed fused SDPA kernel runs beside capture's
explicit P·V, and a kernel that computes other attention (a dropped scale, an ignored mask)
fails the gate at the sites it affects while the recorded weights stay healthy."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import attnaudit
from attnaudit.capturing.parity import PARITY_CALLS_PER_SITE, parity_of, sampled
from attnaudit_examples.date.target import make_target as make_lstm_target
from attnaudit_examples.date_transformer.target import make_target

LIMIT = 8
REAL_SDPA = F.scaled_dot_product_attention
HEALTH_CHECKS = ("non_finite", "masked_mass", "row_sum", "all_masked_nan", "softmax_axis")


def checked(target):
    return attnaudit.audit(target, checks_only=True, limit=LIMIT, progress=False)


def by_check(gate, check):
    return {f.site: f for f in gate.findings if f.check == check}


def test_date_bart_kernel_agrees_with_the_explicit_weights():
    gate = checked(make_target()).gate()
    assert gate.healthy, gate.summary()
    parity = by_check(gate, "backend_parity")
    assert set(parity) == set(gate.sites["site"])  # every site is an SDPA call
    sites = gate.sites.set_index("site")
    for site, finding in parity.items():
        assert finding.status == "pass"
        assert sites.loc[site, "backend_parity_calls"] > 0
        assert sites.loc[site, "backend_parity_relative"] < 1e-5
        assert sites.loc[site, "backend_parity_tolerance"] == pytest.approx(1e-4)


def dropping_scale(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                   scale=None, enable_gqa=False):
    """A fused path that ignores the model's attention scaling."""
    return REAL_SDPA(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                     is_causal=is_causal, enable_gqa=enable_gqa)


def ignoring_mask(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                  scale=None, enable_gqa=False):
    """A fused path that drops the attention mask."""
    return REAL_SDPA(query, key, value, dropout_p=dropout_p, is_causal=is_causal,
                     scale=scale, enable_gqa=enable_gqa)


def assert_weights_healthy(gate):
    for check in HEALTH_CHECKS:
        assert all(f.status == "pass" for f in by_check(gate, check).values()), check


def test_a_kernel_that_drops_the_scale_fails_the_gate(monkeypatch):
    target = make_target()
    for module in target.model.modules():
        if hasattr(module, "scaling"):  # attention scaled unlike 1/sqrt(head_dim)
            module.scaling = module.scaling * 0.5
    monkeypatch.setattr(F, "scaled_dot_product_attention", dropping_scale)
    gate = checked(target).gate()
    assert not gate.healthy
    assert_weights_healthy(gate)
    failing = {site for site, f in by_check(gate, "backend_parity").items()
               if f.status == "fail"}
    assert failing == set(gate.sites["site"]) == set(gate.failing_sites)
    assert "backend_parity" in gate.summary() and "above the tolerance" in gate.summary()


def test_a_kernel_that_ignores_the_mask_fails_at_masked_sites(monkeypatch):
    target = make_target()
    batch = next(iter(target.iter_batches(LIMIT)))
    assert not bool(batch.source_mask.all())  # padded sources: the mask matters
    monkeypatch.setattr(F, "scaled_dot_product_attention", ignoring_mask)
    gate = checked(target).gate()
    assert_weights_healthy(gate)
    findings = by_check(gate, "backend_parity")
    failing = {site for site, f in findings.items() if f.status == "fail"}
    # the encoder's self-attention and the decoder's cross-attention read the padding
    # mask; the decoder's self-attention is causal without one
    expected = {s for s in findings if s.startswith("model.encoder.") or s.endswith(":cross")}
    assert failing == expected and expected, gate.summary()
    for site in failing:
        assert site in gate.summary()
        assert findings[site].value > 1e-2


def test_no_fused_kernel_no_parity_check():
    audit = attnaudit.audit(make_lstm_target(limit=LIMIT), checks_only=True, progress=False)
    gate = audit.gate()
    assert gate.healthy
    assert not by_check(gate, "backend_parity")
    assert (gate.sites["backend_parity_calls"] == 0).all()


def test_sampled_calls_are_budgeted_and_edits_are_not_compared():
    target = make_target()
    batch = next(iter(target.iter_batches(2)))
    start = torch.full((len(batch), 1), target.model.config.decoder_start_token_id)
    args = dict(input_ids=batch.source_ids, attention_mask=batch.source_mask.long(),
                decoder_input_ids=start)
    with torch.no_grad(), sampled(), attnaudit.capture(target.model, keep=False) as cap:
        for _ in range(3):
            target.model(**args)
    gaps = parity_of(cap)
    assert len(gaps) == 6 and all(g.calls == PARITY_CALLS_PER_SITE for g in gaps.values())
    with torch.no_grad(), sampled(), attnaudit.capture(target.model,
                                                        edit=lambda s, w, m: w * 1.0) as cap:
        target.model(**args)
    assert parity_of(cap) == {}
    with torch.no_grad(), attnaudit.capture(target.model) as cap:  # outside the audit
        target.model(**args)
    assert parity_of(cap) == {}


def test_decoder_only_prompt_views_share_their_call_sites_gap(tmp_path, monkeypatch):
    """A left-padded grouped-query Llama: every prompt view of a self-attention site carries
    its call site's gap; a kernel that ignores the padding mask fails them all."""
    transformers = pytest.importorskip("transformers")
    from attnaudit.targets.hf.loading import from_hf
    from tests.helpers.tiny_hf import VOCAB, save_checkpoint

    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32, initializer_range=0.3,
        vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        attn_implementation="sdpa")
    save_checkpoint(transformers.LlamaForCausalLM, config, tmp_path, eos_after=False)

    def target():
        model = transformers.LlamaForCausalLM.from_pretrained(
            tmp_path, attn_implementation="sdpa").eval()
        return from_hf(model, ["w5 w6 w7 w8 w9", "w10 w11"],
                       tokenizer=transformers.AutoTokenizer.from_pretrained(tmp_path),
                       max_new_tokens=3)

    gate = checked(target()).gate()
    assert gate.healthy, gate.summary()
    parity = by_check(gate, "backend_parity")
    assert set(parity) == set(gate.sites["site"]) and len(parity) > 2
    monkeypatch.setattr(F, "scaled_dot_product_attention", ignoring_mask)
    gate = checked(target()).gate()
    assert_weights_healthy(gate)
    assert {s for s, f in by_check(gate, "backend_parity").items()
            if f.status == "fail"} == set(gate.sites["site"])
