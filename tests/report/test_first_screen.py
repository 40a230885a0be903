"""The first screen's numbers are the tables': read here from the CSVs with the ``csv``
module (no pandas, no attnaudit formatting), on the committed date-LSTM and date-BART
reports and on a quick date BART report, whose adversarial search did not run."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from attnaudit.report.first_screen import first_screen
from attnaudit.report.tables import read_csvs

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = [ROOT / "reports" / "date", ROOT / "reports" / "date_bart"]


def rows(folder: Path, name: str) -> list[dict[str, str]]:
    path = folder / f"{name}.csv"
    if not path.is_file():
        return []
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def number_text(estimate: str, low: str, high: str) -> str:
    """"0.505 [0.496, 0.513]" from the CSV's cells, as the page prints a number."""
    if estimate == "" or math.isnan(float(estimate)):
        return "—"
    if "" in (low, high) or math.isnan(float(low)) or math.isnan(float(high)):
        return f"{float(estimate):.3g} (no interval)"
    return f"{float(estimate):.3g} [{float(low):.3g}, {float(high):.3g}]"


def screen_of(folder: Path, explorer: bool = True):
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    return first_screen(read_csvs(folder, manifest.get("tables")), explorer=explorer,
                        quick=manifest["options"]["quick"])


def check_against_csvs(folder: Path) -> None:
    screen = screen_of(folder)
    claims = rows(folder, "claims")
    verdicts = {v["verdict"]: v for v in rows(folder, "verdicts")}
    headline, others = claims[0], claims[1:]
    assert headline["claim"] == "weights_explain"
    assert screen.headline is not None
    assert screen.headline.status == headline["status"] == verdicts["explanation"]["status"]
    assert [(c.key, c.question, c.status, c.number) for c in screen.claims] == [
        (c["claim"], c["question"], c["status"],
         number_text(c["estimate"], c["estimate_low"], c["estimate_high"])) for c in others]
    # validity: sums and maxima of site_summary over the sites
    sites = rows(folder, "site_summary")
    numbers = {n.label: n.value for n in screen.validity}
    assert numbers["attention sites checked"] == str(len(sites))
    assert numbers["counted rows"] == f"{sum(int(s['rows']) for s in sites):,}"
    error = max(float(s["row_sum_error_max"]) for s in sites)
    assert float(numbers["largest |row sum - 1|"]) == pytest.approx(error, rel=1e-3)
    for column, label in (("non_finite_rows", "rows with non-finite weights"),
                          ("negative_rows", "rows with negative weights"),
                          ("all_masked_rows", "rows with no eligible key")):
        assert numbers[label] == f"{sum(int(s[column]) for s in sites):,}"
    # not tested: every claim not tested, item not recorded and measure not computed
    gaps = {g.what: g.why for g in screen.not_tested}
    for claim in others:
        if claim["status"] == "not tested":
            assert gaps[claim["question"]] == claim["answer"].removeprefix("Not tested: ")
    items = rows(folder, "checklist")
    for item in items:
        if item["status"] == "not recorded":
            assert gaps[item["title"]] == item["summary"]
    for measure in rows(folder, "contribution_measures"):
        what = f"contribution measure {measure['measure']}"
        assert (what in gaps) == (measure["status"] != "computed")
        if what in gaps:
            assert measure["reason"] in gaps[what] and "{'" not in gaps[what]
    faithfulness = {r["measure"] for r in rows(folder, "faithfulness_summary")}
    quick = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))["options"]["quick"]
    omitted = quick and bool(faithfulness) and "integrated_gradients" not in faithfulness
    assert ("importance measure integrated_gradients" in gaps) == omitted
    assert len(gaps) == (sum(c["status"] == "not tested" for c in others)
                         + sum(i["status"] == "not recorded" for i in items)
                         + sum(m["status"] != "computed"
                               for m in rows(folder, "contribution_measures")) + omitted)
    recorded = [i for i in items if i["status"] != "not recorded"]
    assert f"{len(recorded)} of {len(items)} checklist items recorded" in screen.tested[0]
    tested = [c for c in others if c["status"] != "not tested"]
    assert screen.tested[1].startswith(f"{len(tested)} of {len(others)} explanation claims")
    # read next: every item that fails or warns, and the sections the page has
    links = [link.href for link in screen.read_next]
    assert [h for h in links if h.startswith("#item-")] == [
        f"#item-{i['item']}" for i in items if i["status"] in ("fail", "warn")]
    assert ("#table-faithfulness_summary" in links) == bool(rows(folder, "faithfulness_summary"))
    assert "#explorer" in links and "#misconceptions" in links


@pytest.mark.parametrize("folder", COMMITTED, ids=lambda p: p.name)
def test_the_committed_reports_first_screen_is_their_tables(folder):
    check_against_csvs(folder)


def test_a_quick_report_first_screen_is_its_tables(cli_reports):
    folder = cli_reports("date_transformer")
    check_against_csvs(folder)
    gaps = {g.what: g.why for g in screen_of(folder).not_tested}
    adversarial = "No very different weights give the same output (adversarial search)"
    assert gaps[adversarial].startswith("the adversarial search did not run")
    assert gaps["contribution measure value_zeroing"].startswith("not run: a quick audit")
    assert gaps["importance measure integrated_gradients"].startswith("not run: a quick audit")


def test_parts_without_their_tables_are_left_out():
    screen = first_screen({}, explorer=False)
    assert (screen.validity, screen.claims, screen.tested, screen.not_tested) == ([], [], [], [])
    assert screen.headline is None
    assert [link.href for link in screen.read_next] == ["#misconceptions"]


def test_long_text_shows_its_first_sentence():
    from attnaudit.report.html import LEAD_CHARS, split_lead

    short = "One sentence. Two."
    assert split_lead(short) == (short, "")
    long = "First part here. " + "x" * LEAD_CHARS
    assert split_lead(long) == ("First part here.", "x" * LEAD_CHARS)
    assert split_lead("y" * (LEAD_CHARS + 5)) == ("y" * (LEAD_CHARS + 5), "")
