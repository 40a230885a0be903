"""``attnaudit report`` on the bundled date model, a small limit, --quick."""

from __future__ import annotations

import hashlib
import json
import math

import pandas as pd
import pytest
import torch
from page import read_page

import attnaudit.target
from attnaudit.checklist import ITEM_KEYS, STATUSES
from attnaudit.cli import main
from attnaudit.target import load_target
from examples.date.data import make_splits
from examples.date.model import load_model
from tests.conftest import assert_unchanged, model_fingerprint

LIMIT = 12


@pytest.fixture(scope="module")
def date_run(tmp_path_factory):
    """The report written by the command line, with the model the command loaded and its
    fingerprint taken before the report ran."""
    out = tmp_path_factory.mktemp("date_report")
    loaded = []

    def load_and_fingerprint(spec):
        target = load_target(spec)
        loaded.append((target.model, model_fingerprint(target.model)))
        return target

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(attnaudit.target, "load_target", load_and_fingerprint)
        assert main(["report", "--limit", str(LIMIT), "--quick", "--out", str(out)]) == 0
    [(model, before)] = loaded
    return out, model, before


@pytest.fixture(scope="module")
def date_report(date_run):
    return date_run[0]


def test_every_checklist_section_has_a_status(date_report):
    page = read_page(date_report / "index.html")
    assert list(page.sections) == list(ITEM_KEYS)
    assert set(page.sections.values()) <= set(STATUSES)
    assert set(page.verdicts) == {"verdict-validity", "verdict-explanation"}
    # The date model's attention is a healthy masked softmax: the validity verdict passes.
    assert page.verdicts["verdict-validity"] == "pass"
    assert page.scripts == 0
    assert all(img["src"].startswith("data:image/png;base64,") for img in page.images)
    assert page.images, "the report has no figure"


def _same(cell: str, value: object) -> bool:
    if isinstance(value, float) and math.isnan(value):
        return cell == ""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return math.isclose(float(cell), float(value), rel_tol=1e-3, abs_tol=1e-12)
    return cell == str(value)


def test_csvs_parse_and_match_the_page_tables(date_report):
    page = read_page(date_report / "index.html")
    assert len(page.tables) >= 10
    for table in page.tables:
        frame = pd.read_csv(date_report / table.csv, keep_default_na=True)
        assert list(frame.columns) == table.header, table.csv
        assert len(table.rows) == min(len(frame), 25), table.csv
        for shown, row in zip(table.rows, frame.itertuples(index=False), strict=False):
            for cell, value in zip(shown, row, strict=True):
                assert _same(cell, value), (table.csv, cell, value)
    listed = {t.csv for t in page.tables} | {"verdicts.csv", "checklist.csv",
                                              "misconceptions.csv"}
    assert {p.name for p in date_report.glob("*.csv")} == listed


def test_checklist_csv_agrees_with_the_page(date_report):
    page = read_page(date_report / "index.html")
    checklist = pd.read_csv(date_report / "checklist.csv")
    assert dict(zip(checklist["item"], checklist["status"], strict=True)) == page.sections


def _independent_state_hash(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    state = model.state_dict()
    for name in sorted(state):
        t = state[name].contiguous()
        digest.update(name.encode())
        digest.update(f"{t.dtype} {tuple(t.shape)}".encode())
        digest.update(t.numpy().tobytes())
    return digest.hexdigest()


def test_manifest_fields_and_hashes(date_report):
    manifest = json.loads((date_report / "manifest.json").read_text())
    model = load_model()
    assert manifest["model"]["class"] == "examples.date.model.DateAttentionModel"
    assert manifest["model"]["parameters"] == sum(p.numel() for p in model.parameters())
    assert manifest["model"]["sha256"] == _independent_state_hash(model)
    texts = [s for s, _ in make_splits().unambiguous("valid", LIMIT)]
    assert manifest["data"]["examples"] == LIMIT
    assert manifest["data"]["sha256"] == hashlib.sha256(
        "".join(t + "\n" for t in texts).encode()).hexdigest()
    assert manifest["sites"] == ["attend:cross"]
    assert manifest["seeds"]["target"] == 6050
    assert manifest["command_line"] == ["attnaudit", "report", "--limit", str(LIMIT),
                                        "--out", str(date_report), "--quick"]
    for library in ("python", "torch", "attnaudit", "captum", "transformers"):
        assert manifest["libraries"][library], library
    assert manifest["timestamp"]
    assert manifest["options"] == {"quick": True, "limit": LIMIT}


def test_report_leaves_the_model_unchanged(date_run):
    _, model, before = date_run
    assert_unchanged(model, before)


def test_bad_limit_is_a_usage_error(tmp_path, capsys):
    assert main(["report", "--limit", "0", "--out", str(tmp_path)]) == 2
    assert "--limit must be a positive number" in capsys.readouterr().err
    assert not (tmp_path / "index.html").exists()
