"""No section of the committed date-LSTM report contradicts the README: the README's
alignment table (AER per measure, date LSTM column) is read from README.md itself and
compared with the report's ``alignment_aer.csv``; a measure the README scores is computed in
the report, and one it marks "n/a" is said not to apply, with its reason, in the table and
on the page."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "reports" / "date"
# README row label -> the measure's name in the report's tables
MEASURES = {"weights": "weights", "value norms": "value_norm", "ALTI+": "alti",
            "rollout": "rollout", "value zeroing": "value_zeroing", "saliency": "saliency",
            "input \u00d7 gradient": "input_x_gradient",
            "integrated gradients": "integrated_gradients", "leave-one-out": "loo"}
CONTRIBUTIONS = {"value_norm", "alti", "rollout", "value_zeroing"}


def readme_lstm_column() -> dict[str, str]:
    """Measure -> the README alignment table's date-LSTM cell (bold marks stripped)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    header = "| measure | date BART, last layer | date BART, layer mean | date LSTM |"
    assert header in text
    table = text[text.index(header):].split("\n\n", 1)[0].splitlines()[2:]
    cells = {}
    for line in table:
        parts = [c.strip() for c in line.strip("|").split("|")]
        cells[MEASURES[parts[0]]] = parts[3].strip("*")
    assert set(cells) == set(MEASURES.values())
    return cells


def test_the_readme_alignment_table_is_the_committed_reports():
    aer = pd.read_csv(REPORT / "alignment_aer.csv")
    emit = aer[aer["convention"] == "emit"].set_index("measure")
    measures = pd.read_csv(REPORT / "contribution_measures.csv",
                           keep_default_na=False).set_index("measure")
    for measure, cell in readme_lstm_column().items():
        if re.fullmatch(r"\d\.\d{3}", cell):
            assert measure in emit.index, measure
            assert f"{emit.loc[measure, 'aer']:.3f}" == cell, measure
            if measure in CONTRIBUTIONS:
                assert measures.loc[measure, "status"] == "computed", measure
        else:
            assert cell.startswith("n/a"), (measure, cell)
            assert measure not in emit.index, measure
            assert measures.loc[measure, "status"] == "not applicable", measure
            assert measures.loc[measure, "reason"], measure


@pytest.mark.parametrize("measure", sorted(CONTRIBUTIONS))
def test_the_page_says_the_same_of_each_contribution_measure(measure):
    page = (REPORT / "index.html").read_text(encoding="utf-8")
    cell = readme_lstm_column()[measure]
    assert "No contribution measure could be computed" not in page
    said_missing = f"Not computed — {measure}:" in page
    assert said_missing == cell.startswith("n/a"), (measure, cell)
    assert "{'" not in page  # no raw Python mapping in any reason
