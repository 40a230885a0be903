"""The faithfulness protocol in the suite on Hugging Face targets from ``from_hf``: an
encoder-decoder (the bundled date BART checkpoint) and a decoder-only model (a tiny seeded
GPT-2, scored per continuation step over the prompt): every measure the quick suite computes
gets a summary row with finite AOPC, normalised AOPC in [0, 1], and the stated baseline."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnaudit.auditing.intervention_suite import run_suite
from attnaudit.targets.hf.loading import from_hf
from tests.helpers.tiny_causal import tiny_causal_checkpoint

BART = Path(__file__).parents[2] / "examples" / "date_transformer" / "model"


def check(suite) -> None:
    summary = suite.tables["faithfulness_summary"]
    rows = suite.tables["faithfulness_rows"]
    assert {"weights", "saliency", "input_x_gradient", "leave_one_out",
            "random"} <= set(summary["measure"])
    # a quick suite ranks by the weights' mean alone, not by each layer's
    assert not summary["measure"].str.startswith("weights:").any()
    assert "weights:layer<i>" in suite.metadata["faithfulness_quick_omits"]
    assert np.isfinite(summary["aopc_comprehensiveness"]).all()
    normalised = rows[["normalised_aopc_comprehensiveness", "normalised_aopc_sufficiency"]]
    assert ((normalised.dropna() >= -1e-9) & (normalised.dropna() <= 1 + 1e-9)).all().all()
    assert summary["baseline"].str.contains("pad token").all()
    assert set(suite.metadata["faithfulness_not_computed"]) | set(summary["measure"]) >= {
        "rollout", "alti_plus", "value_norm"}


def test_an_hf_encoder_decoder():
    target = from_hf(str(BART), ["12 March 2004", "2001-07-09"], max_new_tokens=12)
    check(run_suite(target, quick=True, progress=False, n_permutations=2))


def test_an_hf_decoder_only_model(tmp_path: Path):
    folder, tokenizer = tiny_causal_checkpoint("gpt2", tmp_path / "gpt2")
    target = from_hf(folder, ["w5 w6 w7 w8", "w9 w5 w6"], tokenizer=tokenizer,
                     max_new_tokens=3)
    suite = run_suite(target, quick=True, progress=False, n_permutations=2)
    check(suite)
    assert (suite.tables["faithfulness_rows"]["n_eligible"] >= 1).all()
