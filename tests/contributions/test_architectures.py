"""Beyond the five families tested by hand: mBART (pre-LN with BART's module names), a
BERT-to-BERT EncoderDecoderModel (its output projection sits beside the attention module, in
``attention.output.dense``) and FSMT (eager-only attention over time-major hidden states,
whose values neither capture nor the search by role finds), and OLMo 2 and Gemma 3 (a norm on
the attention's output before the residual) either decompose exactly at every site or say
why at every site."""

from __future__ import annotations

import pytest

from attnaudit.contributions import contributions
from attnaudit.targets.hf.loading import from_hf

transformers = pytest.importorskip("transformers")

from tests.helpers.tiny_hf import save_checkpoint, tiny_config  # noqa: E402
from tests.helpers.tiny_targets import NEW_TOKENS, SOURCES  # noqa: E402

CASES = {
    "mbart": ("MBartConfig", "MBartForConditionalGeneration", {}, "pre"),
    "bert2bert": ("EncoderDecoderConfig", "EncoderDecoderModel",
                  {"decoder": {"is_decoder": True, "add_cross_attention": True}}, "post"),
    "fsmt": ("FSMTConfig", "FSMTForConditionalGeneration", {}, None),
    # decoder-only, a norm on the attention's output before the residual (Gemma's with
    # gamma = 1 + weight)
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}, "sandwich"),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {}, "sandwich"),
}
CAUSAL = ("olmo2", "gemma3")


@pytest.mark.parametrize("case", list(CASES))
def test_every_site_decomposes_or_says_why(case, tmp_path):
    config_name, model_name, extra, placement = CASES[case]
    config = tiny_config(getattr(transformers, config_name), extra)
    save_checkpoint(getattr(transformers, model_name), config, tmp_path,
                    eos_after=case not in CAUSAL)
    target = from_hf(tmp_path, SOURCES, max_new_tokens=NEW_TOKENS)
    batch = next(target.iter_batches())
    result = contributions(target, batch, target.greedy(batch))
    assert len(result.checks) == len(result.trace.sites) == (2 if case in CAUSAL else 6)
    if placement is None:
        assert not result.blocks
        assert all(c.status == "fail" and "does not expose values" in c.detail
                   for c in result.checks)
        return
    assert all(c.status == "pass" for c in result.checks), result.checks
    assert {b.placement for b in result.blocks.values()} == {placement}


@pytest.mark.parametrize("arch", ["zamba", "zamba2"])
def test_a_hybrid_layer_whose_attention_reads_more_than_the_stream_says_why(arch, tmp_path):
    # Zamba's shared attention block reads the hidden state concatenated with the input
    # embeddings (2d wide) and adds a d-wide output: no residual of its input's shape, so
    # ALTI cannot decompose it; the other measures are still read from the same pass
    import torch

    from attnaudit.contributions import measure_maps, measure_maps_or_reasons
    from attnaudit.errors import ContributionError
    from tests.helpers.tiny_causal import tiny_causal_checkpoint

    folder, tokenizer = tiny_causal_checkpoint(arch, tmp_path)
    target = from_hf(folder, SOURCES, tokenizer=tokenizer,
                     max_new_tokens=NEW_TOKENS)
    batch = next(target.iter_batches())
    emitted = target.greedy(batch)
    result = contributions(target, batch, emitted)
    d_model = target.model.config.hidden_size
    hybrid = [n for n in result.trace.sites if n not in result.blocks]
    assert hybrid and all(".shared_transf" in n for n in hybrid)
    for name in hybrid:
        reason = result.reasons[name]
        assert f"{2 * d_model}), not its output's" in reason and f"{d_model})" in reason
    maps, reasons = measure_maps_or_reasons(target, batch, emitted,
                                            ("value_norm", "alti", "rollout"))
    assert set(maps) == {"value_norm", "rollout"} and set(reasons) == {"alti"}
    assert all(f"no ALTI decomposition at {name}" in reasons["alti"] for name in hybrid)
    assert all(torch.isfinite(m).all() for m in maps.values())
    with pytest.raises(ContributionError, match=r"alti cannot be computed for .*reads an input"):
        measure_maps(target, batch, emitted, ["alti"])


def test_self_attention_run_several_times_per_pass_is_not_composed_and_says_why(tmp_path):
    # HRM runs each attention module several times in one pass (its recurrent modules), so
    # a site's rows stack the runs: rollout cannot compose them, the weights are still read
    from attnaudit.contributions import measure_maps_or_reasons
    from tests.helpers.tiny_causal import tiny_causal_checkpoint

    folder, tokenizer = tiny_causal_checkpoint("hrm_text", tmp_path)
    target = from_hf(folder, SOURCES, tokenizer=tokenizer, max_new_tokens=NEW_TOKENS)
    batch = next(target.iter_batches())
    emitted = target.greedy(batch)
    maps, reasons = measure_maps_or_reasons(target, batch, emitted, ("weights", "rollout"))
    assert set(maps) == {"weights"} and set(reasons) == {"rollout"}
    positions = batch.source_ids.shape[1] + emitted.shape[1] - 1
    assert reasons["rollout"].startswith("composition needs every self-attention site")
    assert f"query rows, {positions} keys)" in reasons["rollout"]
