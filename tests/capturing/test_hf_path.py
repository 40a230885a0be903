"""Capture through Hugging Face attention backends, checked against transformers itself.

Every model is built from a tiny config with seeded random init (no hub access). Ground truth
is what transformers returns with ``attn_implementation="eager"`` and
``output_attentions=True`` (or, for edits, a hand-written attention function plugged into the
same model through transformers' own ``AttentionInterface``); nothing here comes from
attnaudit. A larger init std than the default makes attention peaked rather than near
uniform, so a wrong row, head or mask would show.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest
import torch

import attnaudit

transformers = pytest.importorskip("transformers")

from transformers import (  # noqa: E402
    AttentionInterface,
    BartConfig,
    BartForConditionalGeneration,
    BertConfig,
    BertModel,
    MarianConfig,
    MarianMTModel,
    T5Config,
    T5ForConditionalGeneration,
)
from transformers.masking_utils import AttentionMaskInterface, eager_mask  # noqa: E402

TOL = 1e-5
VOCAB = 60
SRC_LEN, SRC_REAL_1 = 7, 5  # row 1 of the source batch has 5 real tokens, then padding
TGT_LEN = 5
N_LAYERS = 2
HEADS = 4
NEW_TOKENS = 6
FAMILIES = ("bart", "marian", "t5")
GRAD_MODES = ("no_grad", "grad")

_COMMON = {"vocab_size": VOCAB, "d_model": 32}
_BART_LIKE = {
    **_COMMON,
    "encoder_layers": N_LAYERS, "decoder_layers": N_LAYERS,
    "encoder_attention_heads": HEADS, "decoder_attention_heads": HEADS,
    "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
    "max_position_embeddings": 64, "init_std": 0.3,
}


def _config(family: str):
    if family == "bart":
        return BartConfig(**_BART_LIKE, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                          decoder_start_token_id=2, forced_eos_token_id=None)
    if family == "marian":
        return MarianConfig(**_BART_LIKE, pad_token_id=VOCAB - 1, eos_token_id=0,
                            decoder_start_token_id=VOCAB - 1, forced_eos_token_id=None)
    if family == "t5":
        # relative_attention_num_buckets / max_distance left at their defaults.
        return T5Config(**_COMMON, d_kv=8, d_ff=64, num_layers=N_LAYERS,
                        num_decoder_layers=N_LAYERS, num_heads=HEADS, pad_token_id=0,
                        eos_token_id=1, decoder_start_token_id=0)
    raise ValueError(family)


_CLASSES = {"bart": BartForConditionalGeneration, "marian": MarianMTModel,
            "t5": T5ForConditionalGeneration}


def _build(family: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return _CLASSES[family](_config(family)).eval()


def _site_names(family: str) -> dict[str, list[str]]:
    """Site names per ground-truth tuple (encoder_attentions, decoder_attentions, cross_...)."""
    layers = range(N_LAYERS)
    if family == "t5":
        return {
            "encoder": [f"encoder.block.{i}.layer.0.SelfAttention:self" for i in layers],
            "decoder": [f"decoder.block.{i}.layer.0.SelfAttention:self" for i in layers],
            "cross": [f"decoder.block.{i}.layer.1.EncDecAttention:cross" for i in layers],
        }
    return {
        "encoder": [f"model.encoder.layers.{i}.self_attn:self" for i in layers],
        "decoder": [f"model.decoder.layers.{i}.self_attn:self" for i in layers],
        "cross": [f"model.decoder.layers.{i}.encoder_attn:cross" for i in layers],
    }


def _truth_tuples(out) -> dict[str, tuple[torch.Tensor, ...]]:
    return {"encoder": out.encoder_attentions, "decoder": out.decoder_attentions,
            "cross": out.cross_attentions}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    shapes = f"{tuple(actual.shape)} vs {tuple(expected.shape)}"
    assert actual.shape == expected.shape, f"{what}: {shapes}"
    diff = (actual.detach().float() - expected.detach().float()).abs().max().item()
    assert diff <= TOL, f"{what}: max abs diff {diff:.3g} > {TOL}"


def assert_left_alone(model: torch.nn.Module, impl: str, training: bool) -> None:
    """What every capture must leave as it found it: backend, mode, hooks."""
    assert model.config._attn_implementation == impl
    assert model.training is training
    for name, module in model.named_modules():
        assert not module._forward_hooks, f"forward hook left on {name!r}"
        assert not module._forward_pre_hooks, f"forward pre-hook left on {name!r}"
    assert not model.config.output_attentions


@dataclass
class Case:
    family: str
    model: torch.nn.Module  # default backend (sdpa)
    eager: torch.nn.Module  # same weights, eager backend, captured (never output_attentions)
    truth_model: torch.nn.Module  # same weights, eager backend, for output_attentions
    inputs: dict[str, torch.Tensor]
    truth: dict[str, tuple[torch.Tensor, ...]]
    logits: torch.Tensor  # sdpa model, no capture


def _inputs(family: str) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    pad = _config(family).pad_token_id
    ids = torch.randint(3, VOCAB - 1, (2, SRC_LEN), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, SRC_REAL_1:] = 0
    ids[1, SRC_REAL_1:] = pad
    dec = torch.randint(3, VOCAB - 1, (2, TGT_LEN), generator=gen)
    return {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": dec}


@pytest.fixture(scope="module", params=FAMILIES)
def case(request) -> Case:
    family = request.param
    model = _build(family)
    assert model.config._attn_implementation == "sdpa"
    eager = _eager_copy(model)
    assert model.config._attn_implementation == "sdpa"
    # output_attentions=True makes transformers install its own (permanent) output-capturing
    # forward hooks, so ground truth runs on a separate copy and the captured models stay
    # hook-free: any hook found on them afterwards was left by capture.
    truth_model = _eager_copy(model)
    inputs = _inputs(family)
    with torch.no_grad():
        truth_out = truth_model(**inputs, output_attentions=True)
        logits = model(**inputs).logits
    assert_close(truth_out.logits, logits, "eager vs sdpa logits (sanity)")
    return Case(family, model, eager, truth_model, inputs, _truth_tuples(truth_out), logits)


def _eager_copy(model: torch.nn.Module) -> torch.nn.Module:
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    assert eager.config._attn_implementation == "eager"
    return eager


def _check_masks(case: Case, cap) -> None:
    names = _site_names(case.family)
    for name in names["cross"]:
        rec = cap.records[name]
        mask = rec.key_mask.expand_as(rec.weights)
        assert mask[0].all(), name
        assert mask[1, :, :, :SRC_REAL_1].all(), name
        assert not mask[1, :, :, SRC_REAL_1:].any(), name
        assert (rec.weights[1, :, :, SRC_REAL_1:] == 0).all(), name
    for name in names["decoder"]:
        rec = cap.records[name]
        n_q, n_k = rec.weights.shape[-2:]
        causal = torch.ones(n_q, n_k, dtype=torch.bool).tril()
        mask = rec.key_mask.expand_as(rec.weights)
        assert torch.equal(mask, causal.expand_as(mask)), name
        assert (rec.weights.masked_select(~causal) == 0).all(), name
    for name in names["encoder"]:
        rec = cap.records[name]
        mask = rec.key_mask.expand_as(rec.weights)
        assert mask[0].all() and mask[1, ..., :SRC_REAL_1].all(), name
        assert not mask[1, ..., SRC_REAL_1:].any(), name


def _check_against_truth(case: Case, cap) -> None:
    names = _site_names(case.family)
    assert set(cap.sites) == {n for group in names.values() for n in group}
    assert set(cap.records) == set(cap.sites)
    for group, site_names in names.items():
        for name, truth in zip(site_names, case.truth[group], strict=True):
            rec = cap.records[name]
            assert rec.kind == ("cross" if group == "cross" else "self"), name
            assert len(rec.calls) == 1, name
            # No decoder padding is used, and padded *source* positions only occur as
            # queries in encoder self-attention, where both the eager mask and the SDPA mask
            # hide padded keys only: padded query rows still attend to the real keys and
            # are identical in both backends, so every row is compared.
            assert_close(rec.weights, truth, name)
    _check_masks(case, cap)


@pytest.mark.parametrize("grad", GRAD_MODES)
def test_sdpa_capture_matches_eager_output_attentions(case: Case, grad: str) -> None:
    model = case.model
    context = torch.no_grad() if grad == "no_grad" else torch.enable_grad()
    with context, attnaudit.capture(model) as cap:
        out = model(**case.inputs)
    assert_left_alone(model, "sdpa", False)
    assert all(r.site.mechanism == "sdpa" for r in cap.records.values())
    assert out.logits.requires_grad is (grad == "grad")
    assert_close(out.logits, case.logits, "logits under capture")
    _check_against_truth(case, cap)
    if grad == "grad":
        # Gradients flow through the captured path as through the fused kernel. The loss is a
        # fixed random projection of the logits, normalised so gradients are O(1).
        proj = torch.randn(out.logits.shape, generator=torch.Generator().manual_seed(3))
        params = [p for p in model.parameters() if p.requires_grad]
        got = torch.autograd.grad((out.logits * proj).mean(), params, allow_unused=True)
        ref = torch.autograd.grad((model(**case.inputs).logits * proj).mean(), params,
                                  allow_unused=True)
        for g, r in zip(got, ref, strict=True):
            assert (g is None) == (r is None)
            if g is not None:
                assert_close(g, r, "gradient under capture")
        assert_left_alone(model, "sdpa", False)


def test_eager_capture_matches_output_attentions(case: Case) -> None:
    model = case.eager
    with torch.no_grad(), attnaudit.capture(model) as cap:
        out = model(**case.inputs)
    assert_left_alone(model, "eager", False)
    assert all(r.site.mechanism == "softmax" for r in cap.records.values())
    assert_close(out.logits, case.logits, "logits under capture (eager)")
    _check_against_truth(case, cap)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_left_padded_decoder_real_rows_match(case: Case, backend: str) -> None:
    """A left-padded decoder row has query rows with every key masked. Their weights differ
    by convention, not by error: eager softmaxes a row of equal finfo.min scores into uniform
    weights, while SDPA with a bool mask yields zero output (and capture records zeros); T5
    adds its float bias mask in both backends, so it is uniform in both. Only real query
    rows are compared; the fully-masked rows must show every key ineligible."""
    model = case.model if backend == "sdpa" else case.eager
    inputs = dict(case.inputs)
    dec_mask = torch.ones_like(inputs["decoder_input_ids"])
    dec_mask[1, :2] = 0
    inputs["decoder_attention_mask"] = dec_mask
    with torch.no_grad():
        truth = case.truth_model(**inputs, output_attentions=True)
        plain = model(**inputs).logits
        with attnaudit.capture(model) as cap:
            out = model(**inputs).logits
    assert_left_alone(model, backend, False)
    assert_close(out, plain, "logits under capture")
    names = _site_names(case.family)
    for name, t in zip(names["decoder"], truth.decoder_attentions, strict=True):
        rec = cap.records[name]
        assert_close(rec.weights[0], t[0], f"{name} unpadded row")
        assert_close(rec.weights[1, :, 2:], t[1, :, 2:], f"{name} real queries")
        mask = rec.key_mask.expand_as(rec.weights)
        assert not mask[1, :, :2].any(), name
        causal = torch.ones(TGT_LEN, TGT_LEN, dtype=torch.bool).tril()
        causal[:, :2] = False
        assert torch.equal(mask[1, :, 2:], causal[2:].expand_as(mask[1, :, 2:])), name
    for name, t in zip(names["cross"], truth.cross_attentions, strict=True):
        assert_close(cap.records[name].weights[1, :, 2:], t[1, :, 2:], name)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_generate_steps_match_teacher_forced(case: Case, backend: str) -> None:
    model = case.model if backend == "sdpa" else case.eager
    src = {k: case.inputs[k] for k in ("input_ids", "attention_mask")}
    gen_kwargs = {"max_new_tokens": NEW_TOKENS, "min_new_tokens": NEW_TOKENS, "num_beams": 1,
                  "do_sample": False, "use_cache": True}
    with torch.no_grad():
        plain = model.generate(**src, **gen_kwargs)
        with attnaudit.capture(model) as cap:
            seq = model.generate(**src, **gen_kwargs)
    assert_left_alone(model, backend, False)
    mechanism = "sdpa" if backend == "sdpa" else "softmax"
    assert all(r.site.mechanism == mechanism for r in cap.records.values())
    assert torch.equal(seq, plain), "generate() output changed under capture"
    assert seq.shape == (2, NEW_TOKENS + 1)  # decoder start + new tokens
    # Teacher forcing on what was generated: step t's query is token t of seq[:, :-1].
    with torch.no_grad():
        truth = _truth_tuples(case.truth_model(**src, decoder_input_ids=seq[:, :-1],
                                         output_attentions=True))
    names = _site_names(case.family)
    n_steps = NEW_TOKENS
    for name, t_enc in zip(names["encoder"], truth["encoder"], strict=True):
        rec = cap.records[name]
        assert len(rec.calls) == 1, name
        assert_close(rec.weights, t_enc, name)
    for name, t_cross in zip(names["cross"], truth["cross"], strict=True):
        rec = cap.records[name]
        assert rec.kind == "cross"
        assert len(rec.calls) == n_steps, name
        assert all(c.weights.shape[2] == 1 for c in rec.calls), name
        assert rec.weights.shape == (2, HEADS, n_steps, SRC_LEN)
        assert_close(rec.weights, t_cross, name)
        mask = rec.key_mask.expand_as(rec.weights)
        assert mask[0].all() and mask[1, ..., :SRC_REAL_1].all(), name
        assert not mask[1, ..., SRC_REAL_1:].any(), name
    causal = torch.ones(n_steps, n_steps, dtype=torch.bool).tril()
    for name, t_self in zip(names["decoder"], truth["decoder"], strict=True):
        rec = cap.records[name]
        assert rec.kind == "self"
        assert len(rec.calls) == n_steps, name
        assert [c.weights.shape[-1] for c in rec.calls] == list(range(1, n_steps + 1)), name
        assert rec.weights.shape == (2, HEADS, n_steps, n_steps)
        # Row t holds the first t + 1 keys; the stacked record pads the rest with 0 and
        # marks it ineligible, which is exactly what the causal eager weights hold there.
        assert_close(rec.weights, t_self, name)
        for t, call in enumerate(rec.calls):
            assert_close(call.weights, t_self[:, :, t:t + 1, :t + 1], f"{name} step {t}")
        assert (rec.weights.masked_select(~causal) == 0).all(), name
        mask = rec.key_mask.expand_as(rec.weights)
        assert torch.equal(mask, causal.expand_as(mask)), name


def test_bert_encoder_self_attention() -> None:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=N_LAYERS,
                        num_attention_heads=HEADS, intermediate_size=64,
                        max_position_embeddings=64, initializer_range=0.3)
    model = BertModel(config).eval()
    assert model.config._attn_implementation == "sdpa"
    eager = _eager_copy(model)
    truth_model = _eager_copy(model)
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(1, VOCAB, (2, SRC_LEN), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, SRC_REAL_1:] = 0
    ids[1, SRC_REAL_1:] = 0
    with torch.no_grad():
        truth = truth_model(input_ids=ids, attention_mask=mask, output_attentions=True)
    expected = [f"encoder.layer.{i}.attention.self:self" for i in range(N_LAYERS)]
    for m, impl in ((model, "sdpa"), (eager, "eager")):
        with torch.no_grad(), attnaudit.capture(m) as cap:
            out = m(input_ids=ids, attention_mask=mask)
        assert_left_alone(m, impl, False)
        assert cap.sites == expected
        assert_close(out.last_hidden_state, truth.last_hidden_state, f"{impl} hidden states")
        for name, t in zip(expected, truth.attentions, strict=True):
            rec = cap.records[name]
            assert rec.kind == "self"
            # Padded query rows attend to the real keys in both backends: compare all rows.
            assert_close(rec.weights, t, f"{impl} {name}")
            key_mask = rec.key_mask.expand_as(rec.weights)
            assert key_mask[0].all() and not key_mask[1, ..., SRC_REAL_1:].any()


# --- edits: uniform cross-attention, checked against transformers' own attention interface --

UNIFORM_IMPL = "attnaudit_test_uniform_cross"


def _uniform_cross_attention(module, query, key, value, attention_mask, scaling=None,
                             dropout=0.0, **kwargs):
    """Eager attention, except modules flagged ``_uniform_test`` attend uniformly over the
    keys the additive mask leaves eligible. Returns ``(B, L, H, D)`` output like eager."""
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, :, : key.shape[-2]]
    if getattr(module, "_uniform_test", False):
        n_q = query.shape[-2]
        if attention_mask is None:
            eligible = torch.ones(*scores.shape[:2], n_q, key.shape[-2], dtype=query.dtype)
        else:
            eligible = (attention_mask[:, :, :, : key.shape[-2]] > -1e4).to(query.dtype)
            eligible = eligible.expand(scores.shape[0], scores.shape[1], n_q, -1)
        weights = eligible / eligible.sum(-1, keepdim=True).clamp_min(1)
    else:
        weights = torch.softmax(scores, dim=-1)
    out = torch.matmul(weights, value).transpose(1, 2).contiguous()
    return out, weights


@pytest.fixture(scope="module")
def uniform_impl():
    AttentionInterface.register(UNIFORM_IMPL, _uniform_cross_attention)
    AttentionMaskInterface.register(UNIFORM_IMPL, eager_mask)  # float additive masks
    yield UNIFORM_IMPL
    AttentionInterface._global_mapping.pop(UNIFORM_IMPL, None)
    AttentionMaskInterface._global_mapping.pop(UNIFORM_IMPL, None)


def _uniform_edit(site, w, m):
    m = m.expand_as(w).to(w.dtype)
    return m / m.sum(-1, keepdim=True).clamp_min(1)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_uniform_cross_edit_matches_attention_interface(uniform_impl: str, backend: str) -> None:
    model = _build("bart")
    if backend == "eager":
        model.set_attn_implementation("eager")
    inputs = _inputs("bart")
    reference = copy.deepcopy(model)
    reference.set_attn_implementation(uniform_impl)
    assert reference.config._attn_implementation == uniform_impl
    for layer in reference.model.decoder.layers:
        layer.encoder_attn._uniform_test = True

    with torch.no_grad():
        expected = reference(**inputs, output_attentions=True)
        plain = model(**inputs).logits
        with attnaudit.capture(model, sites=lambda n: n.endswith(":cross"),
                               edit=_uniform_edit) as cap:
            edited = model(**inputs).logits
    assert_left_alone(model, backend, False)
    names = _site_names("bart")
    assert set(cap.records) == set(names["cross"])
    assert set(cap.sites) == {n for g in names.values() for n in g}
    # The reference really is uniform over the unpadded source, and differs from the model.
    cross0 = expected.cross_attentions[0]
    assert_close(cross0[0], torch.full_like(cross0[0], 1 / SRC_LEN), "reference row 0")
    assert_close(cross0[1, ..., :SRC_REAL_1], torch.full_like(cross0[1, ..., :SRC_REAL_1],
                                                                1 / SRC_REAL_1), "reference row 1")
    assert (plain - expected.logits).abs().max() > 1e-2
    assert_close(edited, expected.logits, "edited logits vs uniform attention interface")
    # Records hold what the model computed before the edit; in layer 0 that is unaffected
    # by the edit, so it equals the unedited model's cross-attention.
    with torch.no_grad():
        unedited = _eager_copy(model)(**inputs, output_attentions=True)
    assert_close(cap.records[names["cross"][0]].weights, unedited.cross_attentions[0],
                 "layer-0 record before edit")

    # The same edit applies at every cached generate() step: per-step logits match the
    # reference model's own generate().
    src = {k: inputs[k] for k in ("input_ids", "attention_mask")}
    gen_kwargs = {"max_new_tokens": NEW_TOKENS, "min_new_tokens": NEW_TOKENS, "num_beams": 1,
                  "do_sample": False, "use_cache": True, "output_logits": True,
                  "return_dict_in_generate": True}
    with torch.no_grad():
        ref_gen = reference.generate(**src, **gen_kwargs)
        with attnaudit.capture(model, sites=lambda n: n.endswith(":cross"),
                               edit=_uniform_edit) as cap:
            got_gen = model.generate(**src, **gen_kwargs)
    assert_left_alone(model, backend, False)
    assert all(len(cap.records[n].calls) == NEW_TOKENS for n in names["cross"])
    assert torch.equal(got_gen.sequences, ref_gen.sequences)
    assert len(got_gen.logits) == len(ref_gen.logits) == NEW_TOKENS
    for step, (got, ref) in enumerate(zip(got_gen.logits, ref_gen.logits, strict=True)):
        assert_close(got, ref, f"edited generate() logits, step {step}")
