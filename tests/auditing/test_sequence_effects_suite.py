"""``run_suite(..., sequence_effects=True)``: the sequence table joins the suite, its summary
rows are the table's own shares and means, and the interventions item says what it found."""

from __future__ import annotations

import pytest

from attnaudit.auditing.intervention_suite import run_suite
from attnaudit.checklist.explanation import intervention_lines

pytest.importorskip("transformers")


def test_the_suite_tables_and_summarises_sequence_effects():
    from attnaudit_examples.date_transformer.target import make_target

    target = make_target()
    suite = run_suite(target, quick=True, limit=2, progress=False, n_permutations=3,
                      cumulative_examples=0, adversarial_examples=0, sequence_effects=True)
    table = suite.tables["sequence_effects"]
    assert set(table["protocol"]) == {"uniform", "zero_top", "zero_random", "perm_median"}
    assert (table["protocol"] == "uniform").sum() == 2
    assert (table["protocol"] == "perm_median").sum() == len(suite.tables["rows"])
    assert "perm_median_draw" in suite.tables["rows"]
    assert suite.tables["rows"]["perm_median_draw"].between(0, 2).all()
    summary = dict(zip(suite.tables["summary"]["metric"], suite.tables["summary"]["value"],
                       strict=True))
    for protocol, group in table.groupby("protocol"):
        assert summary[f"seq_{protocol}_exact_match"] == pytest.approx(
            group["exact_match"].mean())
        assert summary[f"seq_{protocol}_edit_distance"] == pytest.approx(
            group["edit_distance"].mean())
    assert suite.metadata["sequence_effects"] is True
    assert suite.metadata["decoding"].startswith("greedy, the model's generation config")
    lines = [line for line, _ in intervention_lines(suite.tables)]
    assert any(line.startswith("Decoded again with the edit held at every step") for line in lines)
