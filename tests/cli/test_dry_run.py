"""--dry-run prints the plan and runs no audit; report needs --out otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def attnaudit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attnaudit.cli", *args], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, check=False, timeout=600)


def test_report_dry_run_prints_the_plan_alone(tmp_path):
    done = attnaudit("report", "--quick", "--limit", "2", "--dry-run", "--out",
                     str(tmp_path / "r"))
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("plan of audit date: 2 examples in 1 batches")
    names = [line.split()[0] for line in lines[2:-1]]
    assert names == ["validity", "permutation", "uniform", "zeroing", "values", "cumulative",
                     "attribution", "faithfulness", "model"]  # quick: no adversarial search
    assert lines[-2].split()[:2] == ["model", "hash"]  # the manifest's, after the protocols
    assert "audit date: validity" not in done.stderr  # no audit ran
    assert not (tmp_path / "r").exists()
    check = attnaudit("check", "--limit", "2", "--dry-run")
    assert check.returncode == 0 and check.stdout.splitlines()[2].split()[0] == "validity"
    assert len(check.stdout.splitlines()) == 4  # the validity pass alone (the gate hashes none)


def test_report_without_out_or_dry_run_is_a_usage_error():
    done = attnaudit("report", "--limit", "2")
    assert done.returncode == 2
    assert "give --out DIR (or --dry-run" in done.stderr
