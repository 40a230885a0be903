"""The command line on bad input and bad output locations, through the real CLI: one line and
exit 2 for a user error, never a traceback; output folders replaced whole or not at all;
Ctrl-C and SIGTERM leave the previous output byte for byte and exit 130."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from attnaudit.cli import main

ROOT = Path(__file__).resolve().parents[2]
TOYS = ROOT / "tests" / "helpers" / "toys" / "masking.py"
TOY = f"{TOYS}:correct"


def attnaudit(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attnaudit", *args], cwd=cwd,
                          capture_output=True, text=True, check=False, timeout=300,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})


def one_line_error(result: subprocess.CompletedProcess, command: str, *parts: str) -> None:
    """Exit 2, no traceback, and the error as one line naming the command and ``parts``."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    [line] = [x for x in result.stderr.splitlines() if "error:" in x]
    assert line.startswith(f"attnaudit {command}: error: ")
    for part in parts:
        assert part in line


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (relative path) -> sha256 of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def previous_report(tmp_path: Path) -> Path:
    """A folder holding an earlier attnaudit report: a manifest and tables the next run
    does not write (a stale adversarial table, a sub-folder)."""
    folder = tmp_path / "report"
    (folder / "old figures").mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps(
        {"target": "earlier", "libraries": {"attnaudit": "0.0.9"}}) + "\n")
    (folder / "adversarial_candidates.csv").write_text("example,step\n0,0\n")
    (folder / "attribution_delta.csv").write_text("example,convergence_delta\n0,0.1\n")
    (folder / "old figures" / "a.png").write_bytes(b"\x89PNG not really")
    return folder


@pytest.mark.parametrize(("command", "limit"), [("check", "0"), ("report", "-3"),
                                               ("intervene", "0")])
def test_non_positive_limit_is_refused_by_every_command(command, limit, tmp_path):
    extra = ["--out", str(tmp_path / "out")] if command == "report" else []
    result = attnaudit(command, TOY, "--limit", limit, *extra)
    one_line_error(result, command, "argument --limit: must be at least 1", limit)
    assert not (tmp_path / "out").exists()


@pytest.fixture
def unwritable(tmp_path: Path) -> Path:
    """A folder path nobody may create: under a read-only folder (as root, under /sys)."""
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        return locked / "report"
    try:
        Path(tempfile.mkdtemp(dir="/sys")).rmdir()
    except OSError:
        return Path("/sys/attnaudit-report")
    pytest.skip("no location this user cannot write to")


@pytest.mark.parametrize("case", ["empty", "file", "under a file", "unwritable", "foreign"])
def test_bad_output_location_is_refused_before_the_audit(case, tmp_path, unwritable, capsys,
                                                        monkeypatch):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine\n")
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "cat.jpg").write_bytes(b"meow")
    out, message = {
        "empty": ("", "--out is empty"),
        "file": (str(a_file), "is a file, not a folder"),
        "under a file": (str(a_file / "report"), "which is a file"),
        "unwritable": (str(unwritable), "cannot write in"),
        "foreign": (str(foreign), "holds files that are not an attnaudit output"),
    }[case]
    before = snapshot(tmp_path)
    result = attnaudit("report", TOY, "--quick", "--out", out, cwd=tmp_path)
    one_line_error(result, "report", message)
    assert "audit toy_correct" not in result.stderr  # refused before any audit work
    # intervene --out goes through the same check (in-process: no second interpreter)
    monkeypatch.chdir(tmp_path)
    assert main(["intervene", TOY, "--quick", "--out", out]) == 2
    assert message in capsys.readouterr().err
    assert snapshot(tmp_path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "photos"]


def test_force_replaces_a_foreign_folder_whole(tmp_path):
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "cat.jpg").write_bytes(b"meow")
    result = attnaudit("intervene", TOY, "--quick", "--limit", "2", "--out", str(foreign),
                       "--force")
    assert result.returncode == 0, result.stderr
    assert not (foreign / "cat.jpg").exists()
    assert {"manifest.json", "rows.csv", "summary.csv"} <= set(os.listdir(foreign))


def test_completed_report_leaves_no_file_of_the_previous_one(previous_report):
    old = snapshot(previous_report)
    result = attnaudit("report", TOY, "--quick", "--out", str(previous_report))
    assert result.returncode == 0, result.stderr
    new = snapshot(previous_report)
    assert not {"adversarial_candidates.csv", "attribution_delta.csv",
                "old figures/a.png"} & set(new)
    assert new["manifest.json"] != old["manifest.json"]
    assert json.loads((previous_report / "manifest.json").read_text())["target"] == "toy_correct"
    assert {"index.html", "rows.csv", "verdicts.csv"} <= set(new)
    # nothing beside it either: no temporary or moved-aside folder is left
    assert sorted(p.name for p in previous_report.parent.iterdir()) == ["report"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_report_leaves_the_previous_one_byte_for_byte(signum, previous_report):
    before = snapshot(previous_report)
    process = subprocess.Popen(
        [sys.executable, "-m", "attnaudit", "report", TOY, "--out", str(previous_report)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        # a run launched in the background (nohup, some CI wrappers) ignores SIGINT, and a
        # child inherits that; the command under test is started as from a terminal
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert process.stderr is not None
    # the plan comes first; the audit's first progress line says work has started
    first = process.stderr.readline()
    while first and not first.startswith("audit toy_correct: validity: "):
        first = process.stderr.readline()
    assert first.startswith("audit toy_correct: validity: "), first
    process.send_signal(signum)
    _, rest = process.communicate(timeout=120)
    assert process.returncode == 130, rest
    assert "Traceback" not in rest
    what = "interrupted" if signum == signal.SIGINT else "terminated"
    assert rest.strip().splitlines()[-1] == (f"attnaudit report: {what}; an output folder is "
                                             "replaced only by a complete run")
    assert snapshot(previous_report) == before
    assert sorted(p.name for p in previous_report.parent.iterdir()) == ["report"]


BROKEN = '''
from tests.helpers.toys.masking import make_target

def crashing():
    target = make_target("correct")
    def greedy(batch):
        raise ZeroDivisionError("a bug in the target's own code")
    return target.with_options(greedy=greedy)
'''


def test_unexpected_error_is_one_line_and_debug_shows_the_traceback(tmp_path):
    spec = tmp_path / "broken.py"
    spec.write_text(BROKEN)
    out = tmp_path / "report"
    result = attnaudit("report", f"{spec}:crashing", "--quick", "--out", str(out))
    one_line_error(result, "report", "greedy", "ZeroDivisionError",
                   "a bug in the target's own code")
    assert not out.exists()  # a failed run leaves no (empty) output folder
    debug = attnaudit("intervene", f"{spec}:crashing", "--quick", "--debug")
    assert debug.returncode == 2
    assert "Traceback" in debug.stderr and "ZeroDivisionError" in debug.stderr
