"""The misconception "a larger score always means a larger final contribution", judged from
the per-measure table: the sentence carries the table's numbers and the status follows the
share of rows whose top key moves."""

from __future__ import annotations

import pandas as pd

from attnaudit.checklist.contributions import MATERIAL_SHARE, larger_score_judgement

COLUMNS = ["measure", "reading", "rows", "top_differs_from_weights", "top_is_loo_top",
           "kendall_tau_vs_loo", "top_k_overlap_vs_loo"]


def table(alti_differs: float) -> dict[str, pd.DataFrame]:
    return {"weights_vs_contributions": pd.DataFrame([
        ["weights", "w", 40, 0.0, 0.5, 0.31, 0.6],
        ["value_norm", "v", 40, 0.125, 0.55, 0.36, 0.6],
        ["alti", "a", 40, alti_differs, 0.75, 0.42, 0.7]], columns=COLUMNS)}


def test_a_moved_top_key_refutes_always():
    status, text = larger_score_judgement(table(0.25))
    assert status == "refuted"
    assert "largest alti contribution in 25% of 40 rows (value_norm 12%)" in text
    assert "top leave-one-out key in 50% of rows, the top alti key in 75%" in text
    assert "weights 0.31, alti 0.42" in text


def test_top_keys_that_agree_do_not_refute_it():
    status, _ = larger_score_judgement(table(MATERIAL_SHARE / 2))
    assert status == "not refuted here"


def test_no_contribution_measure_no_judgement():
    only_weights = table(0.25)["weights_vs_contributions"].iloc[:1]
    assert larger_score_judgement({"weights_vs_contributions": only_weights}) is None
    assert larger_score_judgement({}) is None
