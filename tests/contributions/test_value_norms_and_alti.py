"""Value-norm contributions and ALTI's re-sum check on tiny BART, Marian, T5, GPT-2 and Llama.

Ground truth for the value norms is a hand computation from each attention module's own
value and output projections (``v_proj``/``out_proj``, ``v``/``o``, ``c_attn``/``c_proj``),
applied to the module's key-side input from a second, eager load of the same checkpoint,
with that load's ``output_attentions``; nothing in it comes from attnaudit.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnaudit.contributions import alti_plus, contributions, measure_maps
from attnaudit.contributions.alti import HALF_RESUM_TOLERANCE, RESUM_TOLERANCE
from attnaudit.targets.hf.loading import from_hf

transformers = pytest.importorskip("transformers")

from tests.helpers.tiny_targets import (  # noqa: E402
    CAUSAL,
    NEW_TOKENS,
    SEQ2SEQ,
    SOURCES,
    decoder_inputs,
    eager_model,
    prompt_inputs,
    save_tiny,
)

TOL = 1e-5


@pytest.fixture(scope="module", params=[*SEQ2SEQ, *CAUSAL])
def traced(request, tmp_path_factory):
    name = request.param
    folder = save_tiny(name, tmp_path_factory.mktemp(name))
    target = from_hf(folder, SOURCES, max_new_tokens=NEW_TOKENS)
    batch = next(target.iter_batches())
    emitted = target.greedy(batch)
    return name, folder, target, batch, emitted, contributions(target, batch, emitted)


def _key_inputs(model: torch.nn.Module, run) -> tuple[dict[str, torch.Tensor], object]:
    """Each attention module's key-side input (by path) during ``run()``, and its output."""
    seen: dict[str, torch.Tensor] = {}
    handles = []
    for path, module in model.named_modules():
        if type(module).__name__.endswith("Attention") and "Layer" not in type(module).__name__:
            def hook(mod, args, kwargs, path=path):
                kv = kwargs.get("key_value_states")
                seen[path] = kv if kv is not None else kwargs.get(
                    "hidden_states", args[0] if args else None)
            handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            out = run()
    finally:
        for handle in handles:
            handle.remove()
    return seen, out


def _head_vectors(name: str, module: torch.nn.Module, x: torch.Tensor, heads: int
                  ) -> torch.Tensor:
    """(B, H, K, d): v_j^h W_O^h from the module's own projections."""
    if name == "gpt2":
        d = x.shape[-1]
        v = (x @ module.c_attn.weight + module.c_attn.bias)[..., 2 * d:]
        w_o = module.c_proj.weight  # (in, out)
    else:
        v_proj = module.v if name == "t5" else module.v_proj
        out = module.o if name == "t5" else (module.out_proj if hasattr(module, "out_proj")
                                             else module.o_proj)
        v = v_proj(x)
        w_o = out.weight.T  # (in, out)
    batch, keys, _ = v.shape
    v = v.view(batch, keys, -1, w_o.shape[0] // heads).transpose(1, 2)
    v = v.repeat_interleave(heads // v.shape[1], dim=1)  # grouped-query: one value per head
    w_o = w_o.view(heads, -1, w_o.shape[1])
    return torch.einsum("bhkv,hvd->bhkd", v, w_o)


def _eager_run(name: str, folder: Path, batch, emitted):
    model = eager_model(name, folder)
    if name in CAUSAL:
        inputs = prompt_inputs(batch, emitted)
        run = lambda: model(**inputs, output_attentions=True)  # noqa: E731
    else:
        run = lambda: model(input_ids=batch.source_ids,  # noqa: E731
                            attention_mask=batch.source_mask.long(),
                            decoder_input_ids=decoder_inputs(model, emitted),
                            output_attentions=True)
    inputs, out = _key_inputs(model, run)
    return model, inputs, out


def _eager_weights(out, role: str) -> list[torch.Tensor]:
    if role == "self":
        return list(out.attentions)
    return list({"encoder_self": out.encoder_attentions, "decoder_self":
                 out.decoder_attentions, "cross": out.cross_attentions}[role])


def test_value_norms_equal_a_hand_computation_from_the_layers_own_projections(traced):
    name, folder, _, batch, emitted, result = traced
    _assert_hand_value_norms(name, folder, batch, emitted, result)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_eager_values_found_by_role_give_the_hand_computed_value_norms(name, tmp_path):
    """GPT-2 fuses query, key and value in one projection; Llama shares value heads."""
    folder = save_tiny(name, tmp_path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    target = from_hf(eager_model(name, folder), SOURCES, tokenizer=tokenizer,
                     max_new_tokens=NEW_TOKENS)
    batch = next(target.iter_batches())
    emitted = target.greedy(batch)
    result = contributions(target, batch, emitted)
    expected = {"gpt2": "attn.c_attn", "llama": "self_attn.v_proj"}[name]
    assert all(s.values_from.endswith(expected) for s in result.trace.sites.values())
    assert [c.status for c in result.checks] == ["pass"] * 2
    _assert_hand_value_norms(name, folder, batch, emitted, result)


def _assert_hand_value_norms(name: str, folder: Path, batch, emitted, result) -> None:
    model, key_inputs, out = _eager_run(name, folder, batch, emitted)
    modules = dict(model.named_modules())
    by_role: dict[str, int] = {}
    assert set(result.value_norms) == set(result.trace.sites), result.reasons
    for site_name, site in result.trace.sites.items():
        layer = by_role.setdefault(site.role, 0)
        by_role[site.role] += 1
        weights = _eager_weights(out, site.role)[layer].float()
        with torch.no_grad():
            vectors = _head_vectors(name, modules[site.module_path],
                                    key_inputs[site.module_path], site.heads)
        per_head = weights * vectors.norm(dim=-1)[:, :, None, :]
        summed = torch.einsum("bhqk,bhkd->bqkd", weights, vectors).norm(dim=-1)
        rows = result.trace.query_mask[site.role]
        got = result.value_norms[site_name]
        torch.testing.assert_close(got.per_head.permute(0, 2, 1, 3)[rows],
                                   per_head.permute(0, 2, 1, 3)[rows], atol=TOL, rtol=TOL)
        torch.testing.assert_close(got.summed[rows], summed[rows], atol=TOL, rtol=TOL)


def test_every_site_re_sums_to_its_real_block_output(traced):
    name, _, _, _, _, result = traced
    placements = {"bart": "post", "marian": "post", "t5": "pre", "gpt2": "pre", "llama": "pre"}
    assert len(result.checks) == len(result.trace.sites)
    for check in result.checks:
        assert check.status == "pass", check
        assert check.value is not None and check.value <= RESUM_TOLERANCE
    assert {b.placement for b in result.blocks.values()} == {placements[name]}
    for block in result.blocks.values():  # real query rows (a padding embedding may be 0)
        sums = block.contributions.sum(-1)[result.trace.query_mask[block.role]]
        torch.testing.assert_close(sums, torch.ones_like(sums), atol=1e-5, rtol=0)


def test_alti_plus_splits_every_step_between_source_and_prefix(traced):
    name, _, _, batch, emitted, result = traced
    plus = alti_plus(result)
    layers = 2
    steps = emitted.shape[1]
    if name in CAUSAL:  # the prompt is the source; the prefix is the generated tokens fed back
        assert plus.source.shape == (len(batch), layers, steps, batch.source_ids.shape[1])
        assert plus.prefix.shape == (len(batch), layers, steps, steps - 1)
    else:
        assert plus.source.shape == (len(batch), layers, steps, batch.source_ids.shape[1])
        assert plus.prefix.shape == (len(batch), layers, steps, steps)
    total = plus.source.sum(-1) + plus.prefix.sum(-1)
    torch.testing.assert_close(total, torch.ones_like(total), atol=1e-5, rtol=0)
    assert bool(((plus.source_share >= 0) & (plus.source_share <= 1 + 1e-5)).all())
    # padded source keys get no share
    if name not in CAUSAL:
        padded = ~batch.source_mask[:, None, None, :].expand_as(plus.source)
        assert float(plus.source[padded].abs().sum()) == 0.0


def _hook_counts(model: torch.nn.Module) -> list[int]:
    return [len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()]


def test_a_declared_projection_is_used_and_a_wrong_one_fails_the_re_sum_check(tmp_path):
    target = from_hf(save_tiny("bart", tmp_path), SOURCES, max_new_tokens=NEW_TOKENS)
    batch = next(target.iter_batches())
    emitted = target.greedy(batch)
    hooks = _hook_counts(target.model)
    result = contributions(target, batch, emitted)
    assert _hook_counts(target.model) == hooks  # the model is left as it was
    site = "model.decoder.layers.1.encoder_attn:cross"
    module = target.model.model.decoder.layers[1].encoder_attn
    right = contributions(target, batch, emitted, projections={site: module.out_proj})
    torch.testing.assert_close(right.value_norms[site].summed, result.value_norms[site].summed)
    assert right.projections[site].path == "declared"
    wrong = contributions(target, batch, emitted, projections={site: module.q_proj})
    check = next(c for c in wrong.checks if c.site == site)
    assert check.status == "fail" and check.rows > 0 and check.value > RESUM_TOLERANCE
    assert "re-sum with a relative error" in check.detail
    others = [c for c in wrong.checks if c.site != site]
    assert all(c.status == "pass" for c in others)
    with pytest.warns(UserWarning, match="does not re-sum to the real output"):
        measure_maps(target, batch, emitted, ["alti"], projections={site: module.q_proj})


@pytest.mark.parametrize("name", ["bart", "llama"])
def test_a_bfloat16_model_decomposes_within_the_half_precision_tolerance(name, tmp_path):
    target = from_hf(save_tiny(name, tmp_path), SOURCES, max_new_tokens=NEW_TOKENS,
                     dtype="bfloat16")
    batch = next(target.iter_batches())
    emitted = target.greedy(batch)
    result = contributions(target, batch, emitted)
    assert [c.status for c in result.checks] == ["pass"] * len(result.trace.sites)
    # bf16 sums are coarse: the errors are real, above fp32's tolerance, below half's
    assert max(c.value for c in result.checks) > RESUM_TOLERANCE
    assert max(c.value for c in result.checks) <= HALF_RESUM_TOLERANCE
    maps = measure_maps(target, batch, emitted)
    assert all(m.dtype == torch.float32 and bool(torch.isfinite(m).all())
               for m in maps.values())
