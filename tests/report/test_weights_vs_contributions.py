"""The report's "Weights vs contributions" section on both bundled models: the date BART
(every contribution measure) and the date LSTM (additive attention: no values, so the
measures are reported as not computed, with the reason)."""

from __future__ import annotations

import pandas as pd

from tests.helpers.report_page import read_page

SECTION = '<section id="weights-vs-contributions">'


def _page_table(page, csv: str):
    return next(t for t in page.tables if t.csv == csv)


def test_bart_report_has_the_section_with_its_tables(cli_reports):
    out = cli_reports("date_transformer")
    html = (out / "index.html").read_text(encoding="utf-8")
    assert SECTION in html and 'id="figure-contribution_maps"' in html
    page = read_page(out / "index.html")
    table = pd.read_csv(out / "weights_vs_contributions.csv")
    assert {"weights", "value_norm", "alti", "rollout"} <= set(table["measure"])
    shown = _page_table(page, "weights_vs_contributions.csv")
    assert [row[0] for row in shown.rows] == list(table["measure"])
    sinks = pd.read_csv(out / "sinks.csv")
    assert len(_page_table(page, "sinks.csv").rows) == min(len(sinks), 25)
    alti = table.set_index("measure").loc["alti", "top_differs_from_weights"]
    assert f"largest alti contribution in {alti:.0%}" in html
    misconceptions = pd.read_csv(out / "misconceptions.csv")
    larger = misconceptions[misconceptions["misconception"].str.startswith("A larger score")]
    assert larger["evidence"].str.contains("largest alti contribution").all()


def test_lstm_report_says_why_the_measures_are_not_computed(cli_reports):
    out = cli_reports("date")
    html = (out / "index.html").read_text(encoding="utf-8")
    assert SECTION in html
    measures = pd.read_csv(out / "contribution_measures.csv", keep_default_na=False)
    assert set(measures["status"]) == {"not applicable"}
    assert (measures["reason"] != "").all()
    assert "Not computed — value_norm: " in html
    table = pd.read_csv(out / "weights_vs_contributions.csv")
    assert not {"value_norm", "alti", "rollout"} & set(table["measure"])
    assert {"weights", "saliency"} <= set(table["measure"])
