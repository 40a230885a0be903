"""The committed date-BART report (``reports/date_bart``: the bundled BART, 400 sources, the
full suite) says what the README publishes: its alignment table's BART columns equal the
report's ``alignment_aer.csv`` (per measure, the column of the reading the report computes),
its verdicts and statuses are the pinned ones, and its page shows the faithfulness table and
the per-claim verdict that the claims table holds."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "reports" / "date_bart"
HEADER = "| measure | date BART, last layer | date BART, layer mean | date LSTM |"
# README row label -> the measure's name in the report's tables
MEASURES = {"weights": "weights", "value norms": "value_norm", "ALTI+": "alti",
            "rollout": "rollout", "value zeroing": "value_zeroing", "saliency": "saliency",
            "input \u00d7 gradient": "input_x_gradient",
            "integrated gradients": "integrated_gradients", "leave-one-out": "loo"}
# the report's weights and per-site contributions are means over the decoder layers; the
# composed measures (ALTI+, rollout) are read after the last layer, and the attributions have
# no layer (the README's first BART column)
LAYER_MEAN = {"weights", "value_norm", "value_zeroing"}
PUBLISHED_VERDICTS = {"validity": "pass", "explanation": "not supported"}
PUBLISHED_STATUSES = {"qkv": "pass", "scoring": "pass", "eligibility": "pass", "masks": "pass",
                      "positions": "not recorded", "distributions": "pass",
                      "performance": "pass",
                      "interventions": "fail"}


def readme_bart_columns() -> dict[str, tuple[str, str]]:
    """Measure -> (last-layer cell, layer-mean cell) of the README's alignment table."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert HEADER in text
    table = text[text.index(HEADER):].split("\n\n", 1)[0].splitlines()[2:]
    cells = {}
    for line in table:
        parts = [c.strip().strip("*") for c in line.strip("|").split("|")]
        cells[MEASURES[parts[0]]] = (parts[1], parts[2])
    assert set(cells) == set(MEASURES.values())
    return cells


def test_the_readme_bart_columns_are_the_committed_report():
    aer = pd.read_csv(REPORT / "alignment_aer.csv")
    emit = aer[aer["convention"] == "emit"].set_index("measure")
    for measure, (last, mean) in readme_bart_columns().items():
        cell = mean if measure in LAYER_MEAN else last
        assert re.fullmatch(r"\d\.\d{3}", cell), (measure, cell)
        assert f"{emit.loc[measure, 'aer']:.3f}" == cell, measure


def test_the_contribution_readings_are_the_columns_compared():
    measures = pd.read_csv(REPORT / "contribution_measures.csv",
                           keep_default_na=False).set_index("measure")
    for measure in ("value_norm", "value_zeroing"):
        assert measures.loc[measure, "status"] == "computed"
        assert measures.loc[measure, "reading"].startswith("mean over the decoder layers")
    for measure in ("alti", "rollout"):
        assert measures.loc[measure, "status"] == "computed"
        assert "after the last" in measures.loc[measure, "reading"]


def test_committed_verdicts_and_statuses_are_the_published_ones():
    verdicts = pd.read_csv(REPORT / "verdicts.csv")
    checklist = pd.read_csv(REPORT / "checklist.csv", keep_default_na=False)
    assert dict(zip(verdicts["verdict"], verdicts["status"], strict=True)) == PUBLISHED_VERDICTS
    assert dict(zip(checklist["item"], checklist["status"], strict=True)) == PUBLISHED_STATUSES


def test_the_page_shows_the_faithfulness_table_and_every_claim():
    page = (REPORT / "index.html").read_text(encoding="utf-8")
    summary = pd.read_csv(REPORT / "faithfulness_summary.csv")
    assert {"weights", "random", "leave_one_out", "alti_plus"} <= set(summary["measure"])
    assert 'id="table-faithfulness_summary"' in page
    claims = pd.read_csv(REPORT / "claims.csv")
    for claim in claims.itertuples(index=False):
        assert f'id="claim-{claim.claim}" data-status="{claim.status}"' in page, claim.claim
    # the headline claim is the verdict, and it cannot pass a claim that was not tested
    headline = claims.set_index("claim").loc["weights_explain", "status"]
    assert headline == PUBLISHED_VERDICTS["explanation"]
