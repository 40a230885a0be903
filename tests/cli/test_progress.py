"""One progress display per command: whole lines in a log file, a single redrawn bar on a
terminal, nothing with --quiet; and the help texts say what the options do."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pandas as pd
import pytest

import attnaudit.cli as attnaudit_cli
import attnaudit.runtime.progress as progress
from attnaudit.auditing.intervention_suite import QUICK_PERMUTATIONS
from attnaudit.interventions.permutation import N_PERMUTATIONS

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def attnaudit(*args: str, stderr=subprocess.PIPE) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attnaudit.cli", *args], cwd=ROOT, env=ENV,
                          stdout=subprocess.PIPE, stderr=stderr, check=False, timeout=600)


def _seconds(interval: str) -> int:
    """tqdm's [H:]MM:SS as seconds."""
    seconds = 0
    for part in interval.split(":"):
        seconds = seconds * 60 + int(part)
    return seconds


def test_a_logged_report_is_whole_lines_with_the_time_left(tmp_path):
    log = tmp_path / "stderr.log"
    with log.open("wb") as stream:
        done = attnaudit("report", "--limit", "4", "--quick", "--out", str(tmp_path / "r"),
                         stderr=stream)
    assert done.returncode == 0
    text = log.read_bytes().decode()
    assert "\r" not in text and text.endswith("\n")
    lines = text.splitlines()
    assert lines[0].startswith("plan of audit date: 4 examples in 1 batches")
    plan = [line for line in lines if line.startswith("  ")]
    assert lines[1 + len(plan)].startswith("audit date: validity: 0/4 examples")
    display = lines[1 + len(plan):]
    assert 3 <= len(display) <= 10, display
    phases = [line for line in display if line.startswith("audit date: ")]
    # each phase counts the 4 sources once (the passes are not added up: no "4/8")
    assert phases[0].startswith("audit date: validity: 0/4 examples")
    assert phases[1].startswith("audit date: interventions: 0/4 examples")
    assert all(" left]" in line for line in phases[:2])
    assert lines[-1].startswith("audit date: ") and lines[-1].endswith(" s in all")
    # the last display line: every part's count done, equal to what the tables hold
    [final] = [line for line in display if line.startswith("audit date: done [")]
    counts = {name: n for name, n, _, _, _ in (part.rsplit(" ", 4)
                                               for part in final.split("; ")[1].split(", "))}
    assert all(" items in " in p or " examples in " in p for p in final.split("; ")[1].split(", "))
    assert counts["validity"] == "4"
    rows = pd.read_csv(tmp_path / "r" / "rows.csv")
    assert int(counts["permutation"]) == QUICK_PERMUTATIONS * len(rows)
    assert int(counts["uniform"]) == 2 * len(rows)  # the paper's uniform and the mass variant
    cumulative = pd.read_csv(tmp_path / "r" / "cumulative.csv")
    assert int(counts["cumulative"]) >= cumulative["keys_removed"].fillna(0).sum() > 0


def test_the_first_estimate_counts_every_protocol_left(tmp_path):
    """A small run of the date LSTM: the time left first shown (during the validity pass,
    from the plan) is of the order of the whole run, not of the validity pass alone."""
    log = tmp_path / "stderr.log"
    with log.open("wb") as stream:
        done = attnaudit("report", "--limit", "3", "--quick", "--out", str(tmp_path / "r"),
                         stderr=stream)
    assert done.returncode == 0
    lines = log.read_bytes().decode().splitlines()
    [estimate] = [line for line in lines if line.startswith("  estimate ")]
    planned = estimate.split()[1]
    planned_s = float(planned) if "s" in estimate.split()[2] else _seconds(planned)
    first = next(line for line in lines if line.startswith("audit date: validity: "))
    left = _seconds(first.split(" elapsed, ")[1].split(" left]")[0])
    assert abs(left - planned_s) <= 1.0, lines  # the first estimate is the whole plan's
    interventions = next(line for line in lines
                         if line.startswith("audit date: interventions: "))
    started = _seconds(interventions.split("[")[1].split(" elapsed")[0])
    [final] = [line for line in lines if line.startswith("audit date: done [")]
    ended = _seconds(final.split("[")[1].split(" elapsed")[0])
    # the suite's part of the run (whole seconds shown), foreseen within a factor of 5
    assert planned_s >= (ended - started - 1) / 5, lines


@pytest.mark.slow
def test_quiet_commands_print_nothing_on_stderr(tmp_path):
    bart = "attnaudit_examples.date_transformer.target:make_target"
    for args in (("check", "--limit", "4", "--quiet"), ("--quiet", "demo"),
                 ("check", bart, "--limit", "2", "--quiet")):
        done = attnaudit(*args)
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        assert done.stderr == b"" and done.stdout


def test_demo_shows_progress():
    done = attnaudit("demo")
    assert done.returncode == 0
    lines = done.stderr.decode().splitlines()
    assert [line.split(": ")[1] for line in lines] == [
        "capture while decoding 400 sources", "alignment audit on the test sources"]
    assert "Attention weights are internal allocation weights" in done.stdout.decode()


def test_a_terminal_sees_one_bar_redrawn():
    main, side = pty.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    process = subprocess.Popen([sys.executable, "-m", "attnaudit.cli", "check", "--limit",
                                "4"], cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                               stderr=side)
    os.close(side)
    data = b""
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:  # the other side closed
            break
        if not chunk:
            break
        data += chunk
    assert process.wait(timeout=600) == 0
    drawn = [part.strip() for part in data.decode().replace("\n", "\r").split("\r")]
    bars = [part for part in drawn if "%|" in part]
    assert bars and all(part.startswith("audit date:") for part in bars)
    assert any(part.startswith("audit date: validity: ") for part in bars)
    others = [part for part in drawn if part and part not in bars]
    assert len(others) == 2 and others[0] == "attnaudit check: loading the target"
    assert others[1].startswith("audit date: ") and others[1].endswith(" s in all")


def test_counters_share_a_batch_and_settle_to_the_total():
    log = io.StringIO()
    with progress.display(10, 2, enabled=True, name="job", stream=log):
        progress.phase("first")
        progress.advance(10)
        progress.phase("second")
        progress.split(6, parts=3)
        with progress.Counter(4, "a", True) as a:
            a.update(2)
            assert progress._open.done == 1  # the phase's count: half of a's share of 2
            a.update(5)  # past its total: no more than its share
            assert progress._open.done == 2
        with progress.Counter(0, "b", True) as b:
            b.total += 3  # a count that grows, as the cumulative test's does
            b.update(3)
        assert progress._open.done == 4
        progress.settle()  # the third counter never ran
        assert progress._open.done == 6
        progress.split(4, parts=1)
        progress.settle()
        assert progress._open.done == 10  # every example of the second pass
    lines = log.getvalue().splitlines()
    assert lines == ["job: first: 0/10 examples [00:00 elapsed, ? left]",
                     lines[1]] and lines[1].startswith("job: second: 0/10 examples")
    assert progress._open is None


def test_help_is_plain_usage_and_quick_says_what_it_changes(capsys):
    top = attnaudit("--help").stdout.decode()
    assert top.startswith("usage: attnaudit")
    assert "``" not in top and ":func:" not in top and ":class:" not in top
    assert "--quiet" in top
    for command in ("report", "intervene"):
        with pytest.raises(SystemExit):
            attnaudit_cli.main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert (f"--quick a cheaper audit: no adversarial search, no integrated gradients "
                f"(unless --methods names them), "
                f"{QUICK_PERMUTATIONS} permutations per row instead of {N_PERMUTATIONS}"
                in text)


def test_the_time_left_sums_every_part_of_the_plan():
    log = io.StringIO()
    with progress.display(4, 2, enabled=True, name="job", stream=log):
        progress.expect("validity", 4, 0.5, unit="examples")
        progress.expect("a", 10, 1.0)
        progress.expect("b", 5, 2.0)
        progress.expect("c", 3)  # a part of unknown cost adds nothing until it runs
        assert progress._open.remaining() == 4 * 0.5 + 10 * 1.0 + 5 * 2.0
        with progress.part("a"), progress.Counter(10, "a", True) as a:
            a.update(10)
        assert progress.done_in("a") == 10 and progress.done_in("b") == 0
        # a ran (far faster than planned): b's estimate is scaled by the same ratio,
        # validity's (another unit) is not
        left = progress._open.remaining()
        scale = progress._open.parts["a"].seconds / 10.0
        assert left == pytest.approx(4 * 0.5 + 5 * 2.0 * scale)
    lines = log.getvalue().splitlines()
    assert lines[-1].startswith("job: done [") and lines[-1].endswith(
        "; validity 0 examples in 00:00, a 10 items in 00:00, b 0 items in 00:00, "
        "c 0 items in 00:00")
