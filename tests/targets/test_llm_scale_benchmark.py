"""``python -m benchmarks.llm_scale`` at tiny sizes: the saved model has the flags' shape
and every measurement the script starts in a fresh process runs (here in this one, to stay
fast) and reports its seconds (the plan's: its estimate of the full audit)."""

from __future__ import annotations

import json

import pytest

from benchmarks import llm_scale

pytest.importorskip("transformers")
TINY = ["--layers", "1", "--hidden", "32", "--heads", "4", "--kv-heads", "2", "--mlp", "64",
        "--vocab", "120", "--check-tokens", "10", "--quick-tokens", "8", "--new-tokens", "2"]


def test_each_measurement_runs_on_a_model_of_the_flags_shape(tmp_path, capsys):
    from transformers import AutoConfig

    args = llm_scale._arguments(TINY)
    params = llm_scale.build(tmp_path, args)
    config = AutoConfig.from_pretrained(tmp_path)
    assert (config.num_hidden_layers, config.hidden_size, config.num_key_value_heads,
            config.vocab_size, config.tie_word_embeddings) == (1, 32, 2, 120, True)
    assert params == 120 * 32 + 32 * (32 + 2 * 16 + 32) + 3 * 32 * 64 + 3 * 32  # tied head
    for what, tokens in (("model", "10"), ("check", "10"), ("quick", "8"), ("plan", "8")):
        llm_scale.child(llm_scale._arguments(
            [*TINY, "--child", what, "--folder", str(tmp_path), "--prompt-tokens", tokens]))
        printed = capsys.readouterr()
        result = json.loads(printed.out.strip().splitlines()[-1])
        assert result["seconds"] > 0 and result["device_peak_gib"] is None
        if what == "quick":  # each protocol's time, from the progress line
            parts = llm_scale.breakdown(printed.err)
            assert parts.startswith("validity") and "faithfulness" in parts, printed.err[-500:]
            estimate, planning = llm_scale.planned_seconds(printed.err)  # printed before it
            assert estimate > 0 and 0 <= planning < result["audit_seconds"] <= result["seconds"]
        if what == "plan":  # the full audit's plan, printed whole
            assert "plan of audit llm-scale" in printed.err and "faithfulness" in printed.err
