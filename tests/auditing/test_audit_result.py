"""``attnaudit.audit`` and the views of its result, on the toy targets (fast)."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
import torch
from matplotlib.figure import Figure as MplFigure

import attnaudit
from attnaudit.errors import AuditError, TargetError
from attnaudit.validity.gate import HEALTHY, UNHEALTHY
from tests.helpers.fingerprints import assert_unchanged, model_fingerprint
from tests.helpers.toys.masking import make_target

SCRIPT = "<script>alert(1)</script>"


@pytest.fixture(scope="module")
def leaky(tmp_path_factory):
    """A quick audit of the toy whose mask is applied after the softmax, and its report."""
    result = attnaudit.audit(make_target("after_softmax"), quick=True, progress=False)
    out = tmp_path_factory.mktemp("leaky")
    result.save(out)
    return result, out


def test_the_result_holds_every_part(leaky):
    result, _ = leaky
    assert result.validity is not None and result.suite is not None
    assert result.checklist is not None and result.suite_reason is None
    assert set(result.checklist.tables()) < set(result.tables)
    assert {"verdicts", "checklist", "misconceptions", "rows", "sites"} <= set(result.tables)
    assert result.verdicts["validity"] == "fail"
    assert result.statuses["eligibility"] == "fail"
    assert result.thresholds == {"max_masked_mass": 1e-6, "row_sum_tolerance": None}


def test_gate_names_the_failing_site(leaky):
    result, _ = leaky
    gate = result.gate()
    assert gate.status == UNHEALTHY and gate.failing_sites == ["attend:cross"]
    assert "FAILED: 1 of 1 site(s) failing: attend:cross" in gate.summary()
    assert gate.to_dict()["failing_sites"] == ["attend:cross"]
    with pytest.raises(ValueError, match="rows were counted at max_masked_mass"):
        result.gate(max_masked_mass=0.5)


def test_load_round_trips_every_table_and_the_judgement(leaky):
    result, out = leaky
    loaded = attnaudit.Audit.load(out)
    assert list(loaded.tables) == list(result.tables)
    for name, table in result.tables.items():
        pd.testing.assert_frame_equal(loaded.tables[name], table, obj=name)
    assert loaded.verdicts == result.verdicts and loaded.statuses == result.statuses
    assert loaded.validity is None and loaded.checklist is None
    live, again = result.gate(), loaded.gate()
    assert (again.status, again.findings, again.examples) == (live.status, live.findings,
                                                             live.examples)
    with pytest.raises(AuditError, match="a loaded audit has its tables only"):
        loaded.save(out / "again")


def test_load_refuses_a_folder_without_a_manifest(tmp_path):
    with pytest.raises(AuditError, match="not an attnaudit report folder"):
        attnaudit.Audit.load(tmp_path)


def test_figures_are_the_reports(leaky):
    result, out = leaky
    names = result.figure_names()
    assert names[0] == "example_map_0" and "masked_mass" in names and "agreement" in names
    assert isinstance(result.figure("masked_mass"), MplFigure)
    with pytest.raises(KeyError, match="no figure 'nope'"):
        result.figure("nope")
    page = (out / "index.html").read_text(encoding="utf-8")
    assert page.count("data:image/png;base64,") == len(names)
    # a loaded audit draws everything but the example maps from its tables
    assert attnaudit.Audit.load(out).figure_names() == names[1:]


def test_notebook_summary_is_escaped():
    target = make_target(name=f"toy {SCRIPT}", description=f"about {SCRIPT}")
    result = attnaudit.audit(target, interventions=False, progress=False)
    html = result._repr_html_()
    assert SCRIPT not in html and "toy &lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "Valid weighted retrieval computation?" in html
    assert html.count("<tr>") == 1 + 2 + 1 + 8  # headers, 2 verdicts, 8 items; no numbers
    assert result.suite is None and "interventions=False" in result.suite_reason
    assert result.statuses["interventions"] == "not recorded"


def test_checks_only_runs_the_gate_checks_alone(tmp_path):
    result = attnaudit.audit(make_target("correct", sources=([3, 4], [5])), checks_only=True,
                             progress=False)
    assert result.gate().status == HEALTHY and result.suite is None
    assert result.validity.example is None and result.validity.performance["plain_s"].isna().all()
    assert not result.validity.metrics["metric"].isin(["entropy", "score_min"]).any()
    assert result.manifest["model"]["sha256"] is None  # no pass over every parameter
    assert "not hashed (a checks-only audit)" in result.save(tmp_path).read_text("utf-8")


def test_device_and_dtype_are_undone_after_the_audit():
    target = make_target("correct", sources=([3, 4, 5], [6, 7]))
    before = model_fingerprint(target.model)
    params = list(target.model.parameters())
    result = attnaudit.audit(target, dtype="bfloat16", interventions=False, progress=False)
    assert set(result.tables["sites"]["weights_dtype"]) == {"bfloat16"}
    assert_unchanged(target.model, before)
    assert list(target.model.parameters()) == params
    assert {p.dtype for p in params} == {torch.float32}


@pytest.mark.parametrize(("call", "message"), [
    (lambda t: attnaudit.audit(t, data=["x"]), "go with a model or a model folder"),
    (lambda t: attnaudit.audit(t.model), "needs data="),
    (lambda t: attnaudit.audit(t, limit=0), "limit must be a positive number"),
])
def test_bad_arguments_are_clear_errors(call, message):
    with pytest.raises(TargetError, match=message):
        call(make_target())


def test_a_limited_audit_prints_what_it_audited():
    """After ``limit=10`` the repr, the notebook summary and the page's header count the 10
    examples audited, not the 400 of the data, and name the verdicts and statuses."""
    from attnaudit_examples.date.target import make_target as date_target

    result = attnaudit.audit(date_target(), limit=10, checks_only=True, progress=False)
    text = repr(result)
    assert "examples=10," in text and "400" not in text
    assert "verdicts: validity=pass" in text and len(text.splitlines()) <= 6
    for status in set(result.statuses.values()):
        assert f"{status}: " in text
    assert "400" not in result.description
    assert ", 10 examples," in result._repr_html_()
    gate = result.gate()
    assert gate.status == HEALTHY == 0 and gate.status.name == "HEALTHY"
    assert repr(gate).startswith("GateResult(target='date', status=HEALTHY (0), examples=10,")
    assert len(repr(gate).splitlines()) <= 6


def test_gate_repr_fits_one_screen_with_many_failing_sites(leaky):
    result, _ = leaky
    gate = result.gate()
    many = dataclasses.replace(gate, findings=[
        dataclasses.replace(f, site=f"site{i}") for i in range(30) for f in gate.findings
        if f.status == "fail"])
    text = repr(many)
    assert text.startswith("GateResult(target='toy_after_softmax', status=UNHEALTHY (1),")
    assert "site0, site1," in text and "... (22 more)" in text and "site29" not in text
    assert len(text.splitlines()) <= 6 and max(map(len, text.splitlines())) < 200
    assert int(gate.status) == 1 and gate.to_dict()["exit_code"] == 1
