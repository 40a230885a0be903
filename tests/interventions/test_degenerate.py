"""Degenerate data is a finding, not a crash: one-token sources, all-special sources and
empty outputs are counted apart in the suite's ``degenerate`` table, left out of every
per-row protocol, and never reach a summary as NaN."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from attnaudit.auditing.intervention_suite import run_suite
from attnaudit.errors import InterventionError
from tests.helpers.toys.masking import EOS, PAD, make_target

ROOT = Path(__file__).resolve().parents[2]
SPECIAL = 3
# 0: one token; 1: only special tokens; 2, 3, 5: ordinary (3 and 5 with a special token
# inside); 4: ordinary, but its output is made empty (end of sequence at step 0).
SOURCES = ([4], [SPECIAL, SPECIAL], [5, 4], [6, SPECIAL, 4], [4, 6], [7, SPECIAL, 5])
EMPTY = 4


def degenerate_target():
    target = make_target("correct", SOURCES, batch_size=4)
    greedy = target.greedy

    def empty_for_one(batch):
        emitted = greedy(batch).clone()
        for i, text in enumerate(batch.texts):
            if text == " ".join(map(str, SOURCES[EMPTY])):
                emitted[i, 0] = EOS
        return emitted

    return target.with_options(greedy=empty_for_one, special_ids=(PAD, SPECIAL))


def expected_degenerate(target) -> pd.DataFrame:
    """From the sources alone: eligible keys are the non-special tokens; every step up to
    the first end of sequence is a row."""
    out = []
    for example, source in enumerate(SOURCES):
        [emitted] = target.greedy(next(iter(make_target("correct", (source,)).batches())))
        steps = int(target.step_mask(emitted[None]).sum())
        n_valid = sum(token not in (PAD, SPECIAL) for token in source)
        reason = ("empty output" if int(emitted[0]) == EOS else "no eligible key"
                  if n_valid == 0 else "one eligible key" if n_valid == 1 else "")
        out += [(example, step, n_valid, reason) for step in range(steps)]
    return pd.DataFrame(out, columns=["example", "step", "n_valid", "reason"])


@pytest.fixture(scope="module")
def suite():
    return run_suite(degenerate_target(), quick=True, progress=False, n_permutations=4)


def test_degenerate_rows_are_listed_with_their_reason(suite):
    expected = expected_degenerate(degenerate_target())
    got = suite.tables["degenerate"].sort_values(["example", "step"], ignore_index=True)
    want = expected[expected.reason != ""].reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
    assert set(want.reason) == {"empty output", "no eligible key", "one eligible key"}
    assert suite.metadata["degenerate_rows"] == {"negligible view mass": 0,
                                                 **want.reason.value_counts().to_dict()}


def test_protocols_run_on_the_other_rows_only_and_summaries_have_no_nan(suite):
    expected = expected_degenerate(degenerate_target())
    counted = expected[expected.reason == ""][["example", "step"]]
    rows = suite.tables["rows"].sort_values(["example", "step"], ignore_index=True)
    assert rows[["example", "step"]].values.tolist() == counted.values.tolist()
    assert (rows["n_valid"] >= 2).all()
    # the other-example control needs values, which this softmax-path site does not expose
    tvd = rows.drop(columns=["zero_top_tvd"]).filter(like="_tvd")
    assert not tvd.drop(columns=tvd.filter(like="value_other_example").columns).isna().any().any()
    summary = suite.tables["summary"]
    assert not summary["value"].isna().any()
    assert (summary.set_index("metric").loc["perm_median_tvd", "n"]) == len(counted)
    # agreement keeps one-key rows, excluded with their reason, instead of dying on them
    agree = suite.tables["agreement"]
    one_key = agree[agree.example == 0]
    assert len(one_key) and (one_key.excluded == "fewer than 2 eligible keys").all()
    assert not suite.tables["agreement_summary"].isna().any().any()


def test_all_rows_degenerate_is_a_clear_error():
    target = make_target("correct", ([4], [3]))
    with pytest.raises(InterventionError, match=r"no row to intervene on: all \d+ rows of "
                                                r"the 2 examples are degenerate \(\d+ one "
                                                r"eligible key\)"):
        run_suite(target, quick=True, progress=False, n_permutations=2)


def test_report_on_degenerate_data_completes_through_the_cli(tmp_path):
    spec = tmp_path / "target.py"
    spec.write_text("from tests.interventions.test_degenerate import degenerate_target\n")
    out = tmp_path / "report"
    result = subprocess.run(
        [sys.executable, "-m", "attnaudit", "report", f"{spec}:degenerate_target", "--quick",
         "--out", str(out)], cwd=ROOT, capture_output=True, text=True, check=False,
        timeout=300, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    table = pd.read_csv(out / "degenerate.csv")
    assert table.reason.value_counts().to_dict() == (
        expected_degenerate(degenerate_target()).query("reason != ''").reason.value_counts()
        .to_dict())
    assert "Degenerate rows, left out of every per-row protocol" in (
        out / "index.html").read_text()
