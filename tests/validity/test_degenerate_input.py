"""The gate on degenerate input: data with no real source token fails (exit 1) instead of
passing as healthy; data with some degenerate rows passes with a warning that counts them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

import attnaudit
from attnaudit.validity.findings import input_findings
from attnaudit.validity.pipeline import run_validity_audit
from tests.helpers.toys.masking import EOS, PAD, SOURCES, make_target

ROOT = Path(__file__).resolve().parents[2]
SPECIAL = 3


def only_special_tokens():
    """Every source is special tokens only, as a tokenizer that knows none of the text
    would make them."""
    return make_target("correct", ([SPECIAL, SPECIAL], [SPECIAL]),
                       name="specials").with_options(special_ids=(PAD, SPECIAL))


def test_sources_of_special_tokens_only_fail_the_gate(tmp_path):
    # A dotted spec, resolved against the working directory as a user's own package is.
    result = subprocess.run([sys.executable, "-m", "attnaudit", "check",
                             "tests.validity.test_degenerate_input:only_special_tokens"],
                            cwd=ROOT, capture_output=True,
                            text=True, check=False, timeout=300,
                            env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert result.returncode == 1, result.stdout + result.stderr
    assert "healthy" not in result.stdout and "Traceback" not in result.stderr
    assert "FAIL  (input)  degenerate: every one of the" in result.stdout
    assert "no eligible key" in result.stdout
    assert "FAILED: 0 of 1 site(s) failing; every input row is degenerate" in result.stdout


def test_some_degenerate_rows_are_counted_per_reason():
    target = make_target("correct")
    counts = {"empty output": 0, "no eligible key": 0, "one eligible key": 0,
              "negligible view mass": 0}
    rows = 0
    for source in SOURCES:  # each alone: the toy's output does not depend on batching
        [emitted] = target.greedy(next(iter(make_target("correct", (source,)).batches())))
        emitted = emitted.tolist()
        steps = emitted.index(EOS) + 1 if EOS in emitted else len(emitted)
        rows += steps
        if emitted[0] == EOS:
            counts["empty output"] += steps
        elif len(source) < 2:
            counts[["no eligible key", "one eligible key"][len(source)]] += steps
    audit = run_validity_audit(target, progress=False, timing=False, keep_example=False)
    assert audit.degenerate.rows == rows
    assert audit.degenerate.counts == counts
    assert sum(counts.values()) > 0 and audit.degenerate.counted > 0


def test_outputs_without_any_step_are_empty_outputs_not_a_crash(tmp_path):
    target = make_target("correct").with_options(
        greedy=lambda batch: torch.zeros(len(batch), 0, dtype=torch.long))
    audit = run_validity_audit(target, progress=False, timing=False)
    assert (audit.degenerate.rows, audit.degenerate.counted) == (len(SOURCES), 0)
    assert audit.degenerate.counts["empty output"] == len(SOURCES)
    [finding] = input_findings(audit.degenerate)
    assert (finding.status, finding.rows) == ("fail", len(SOURCES))
    page = attnaudit.audit(target, quick=True, progress=False).save(tmp_path / "report")
    assert "the greedy outputs of the 5 examples have no step" in page.read_text()
