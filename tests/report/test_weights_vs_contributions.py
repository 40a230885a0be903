"""The report's "Weights vs contributions" section on both bundled models: the date BART
(every contribution measure) and the date LSTM (additive attention: no values, so the
measures are reported as not computed, with the reason)."""

from __future__ import annotations

import pandas as pd
import pytest

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
    assert set(measures["status"]) == {"not applicable", "not run"}  # quick: no zeroing
    assert (measures["reason"] != "").all()
    assert "Not computed — value_norm: " in html
    table = pd.read_csv(out / "weights_vs_contributions.csv")
    assert not {"value_norm", "alti", "rollout"} & set(table["measure"])
    assert {"weights", "saliency"} <= set(table["measure"])
    aer = pd.read_csv(out / "alignment_aer.csv")  # the date LSTM declares gold alignments
    assert {"weights", "loo"} <= set(aer["measure"]) and "value_norm" not in set(aer["measure"])
    assert set(aer["sentences"]) == {12}


def test_bart_report_alignment_table_equals_attnaudit_align(cli_reports):
    from attnaudit.alignments.pharaoh import read_alignments
    from attnaudit.alignments.run import aer_table
    from attnaudit.targets.loading import load_target
    from tests.alignments.test_align_command import GOLD
    from tests.conftest import BART_LIMIT, BUNDLED

    out = cli_reports("date_transformer")
    table = pd.read_csv(out / "alignment_aer.csv").set_index(["measure", "convention"])
    assert any(t.csv == "alignment_aer.csv" for t in read_page(out / "index.html").tables)
    target = load_target(BUNDLED["date_transformer"][0])
    gold = read_alignments(GOLD)[:BART_LIMIT]
    direct = aer_table(target, gold, ["weights", "loo"], units="tokens", layer="mean",
                       limit=BART_LIMIT).set_index(["measure", "convention"])
    for key in direct.index:
        assert table.loc[key, "aer"] == pytest.approx(direct.loc[key, "aer"], abs=1e-9)
        assert table.loc[key, "links"] == direct.loc[key, "links"]
