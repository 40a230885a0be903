"""SIGTERM ends the command as Ctrl-C does however it was launched: in a session of its own
(no controlling terminal, no job control) with SIGINT ignored, as a script's background job
is, it prints the "terminated" line, exits 130 and leaves the earlier output folder as it
was, whether the signal arrives while the libraries import or while the audit runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli.test_output_folders import snapshot

ROOT = Path(__file__).resolve().parents[2]
LINE = "attnaudit intervene: terminated; an output folder is replaced only by a complete run"


def _background_job(out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "attnaudit", "intervene", "--quick", "--limit", "2",
         "--out", str(out)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"}, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))


def _catches_sigterm(pid: int) -> bool:
    """Whether the process has a handler for SIGTERM (the SigCgt mask of /proc/PID/status)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt"))
    return bool(int(caught, 16) >> (signal.SIGTERM - 1) & 1)


def _torch_loaded(pid: int) -> bool:
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


@pytest.fixture
def earlier_output(tmp_path: Path) -> Path:
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "manifest.json").write_text(
        '{"target": "earlier", "libraries": {"attnaudit": "0.0.9"}}\n')
    (folder / "interventions.csv").write_text("method,tvd\nuniform,0.5\n")
    return folder


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
@pytest.mark.parametrize("when", ["while importing", "while auditing"])
def test_sigterm_in_a_background_session_exits_130_with_the_line(when, earlier_output):
    before = snapshot(earlier_output)
    process = _background_job(earlier_output)
    assert process.stderr is not None
    if when == "while importing":
        deadline = time.monotonic() + 60
        while not _catches_sigterm(process.pid):
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.002)
        # the handler is in place before torch (seconds of imports) has loaded
        assert not _torch_loaded(process.pid)
    else:
        # the plan comes first; the first progress line says the audit has started
        first = process.stderr.readline()
        while first and not first.startswith("interventions date"):
            first = process.stderr.readline()
        assert first.startswith("interventions date"), first
    process.send_signal(signal.SIGTERM)
    _, rest = process.communicate(timeout=120)
    assert process.returncode == 130, rest
    assert "Traceback" not in rest
    assert rest.strip().splitlines()[-1] == LINE
    assert snapshot(earlier_output) == before
    assert sorted(p.name for p in earlier_output.parent.iterdir()) == ["out"]
