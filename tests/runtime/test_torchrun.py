"""``torchrun --nproc_per_node 2 -m attnaudit ...`` (gloo, CPU) is the single-process audit:
on both bundled models (in batches of four, so that both ranks get examples) the per-row
tables are the same bytes, summaries agree to 1e-9, analyser summaries to 1e-6, the
checklists (but the performance item's status, judged from the times of the moment) and the
gate say the same; a rank that
fails stops the job, named, within a bounded time, and a rank that stalls is given up after
the collective timeout."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import attnaudit
from attnaudit.auditing.result import Audit
from attnaudit.targets.loading import load_target
from tests.helpers.timing import TIMED, load_free

# two ranks per launch, tens of seconds each; a file runs on one worker (--dist loadfile),
# so the launches run one at a time and a collective timeout measures the job
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TARGETS = "tests.helpers.distributed_targets"
LIMITS = {"date_lstm": 12, "date_transformer": 8}  # 3 and 2 batches of four
PER_ROW = {"rows", "agreement", "degenerate", "cumulative"}
SUMMARIES = {"summary", "permutation_bins", "zeroing_flips", "value_controls",
             "cumulative_summary", "agreement_summary"}
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(*args: str, timeout: float = 240, **env: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
            "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
            "-m", "attnaudit", *args]
    return subprocess.run(argv, cwd=ROOT, env={**ENV, **env}, capture_output=True, text=True,
                          check=False, timeout=timeout)


def read(folder: Path, table: str) -> pd.DataFrame:
    return pd.read_csv(folder / f"{table}.csv")


def assert_frames_close(single: pd.DataFrame, ranks: pd.DataFrame, tol: float,
                        table: str) -> None:
    assert list(single.columns) == list(ranks.columns), table
    assert single.shape == ranks.shape, table
    numeric = single.select_dtypes("number").columns
    for column in single.columns:
        if column in numeric and pd.api.types.is_numeric_dtype(ranks[column]):
            np.testing.assert_allclose(ranks[column].to_numpy(float),
                                       single[column].to_numpy(float), rtol=0, atol=tol,
                                       equal_nan=True, err_msg=f"{table}.{column}")
        else:
            assert single[column].fillna("").astype(str).tolist() == \
                ranks[column].fillna("").astype(str).tolist(), f"{table}.{column}"


@pytest.mark.parametrize("factory", list(LIMITS))
def test_two_ranks_write_the_single_process_report(factory, tmp_path):
    if factory == "date_transformer":
        pytest.importorskip("transformers")
    limit = LIMITS[factory]
    single = attnaudit.audit(load_target(f"{TARGETS}:{factory}"), limit=limit, quick=True,
                             progress=False)
    single.save(tmp_path / "single")
    out = tmp_path / "ranks"
    result = torchrun("report", f"{TARGETS}:{factory}", "--limit", str(limit), "--quick",
                      "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("attnaudit report: wrote") == 1  # rank 0 alone writes, prints

    written = {p.name for p in out.iterdir()}
    assert written == {p.name for p in (tmp_path / "single").iterdir()}
    tables = {name.removesuffix(".csv") for name in written if name.endswith(".csv")}
    assert tables >= PER_ROW | SUMMARIES
    for table in PER_ROW:  # bit for bit: the CSV writes each float's shortest repr
        assert (out / f"{table}.csv").read_bytes() == \
            (tmp_path / "single" / f"{table}.csv").read_bytes(), table
    assert len(read(out, "rows")) > 0
    for table in SUMMARIES:
        assert_frames_close(read(tmp_path / "single", table), read(out, table), 1e-9, table)
    for table in tables - TIMED - PER_ROW - SUMMARIES:  # analyser summaries, checklist...
        # but the performance item's status: judged from measured times, it moves with the
        # load of the moment (a rank sharing the cores with the other rank and a test worker
        # measured capture above 2x in every round where the single process did not)
        single_table, ranks_table = read(tmp_path / "single", table), read(out, table)
        if table == "checklist":
            single_table, ranks_table = load_free(single_table), load_free(ranks_table)
        assert_frames_close(single_table, ranks_table, 1e-6, table)
    batches = ["batch", "examples", "source_tokens", "target_tokens"]
    assert read(out, "performance")[batches].equals(read(tmp_path / "single", "performance")[
        batches])
    assert read(out, "performance")["batch"].tolist() == list(range(-(-limit // 4)))

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["distributed"] == {"world_size": 2, "backend": "gloo"}
    assert single.manifest["distributed"] == {"world_size": 1, "backend": None}
    assert manifest["data"] == single.manifest["data"]
    assert Audit.load(out).gate().status == single.gate().status


def launch_by_hand(args: list[str], out: Path) -> list[subprocess.CompletedProcess]:
    """Two ranks started with the environment torchrun gives them, to read each one's
    exit status and output."""
    port = str(free_port())
    procs = []
    for rank in (0, 1):
        env = {**ENV, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        procs.append(subprocess.Popen([sys.executable, "-m", "attnaudit", *args], cwd=ROOT,
                                      env=env, stdout=(out / f"{rank}.out").open("w"),
                                      stderr=(out / f"{rank}.err").open("w")))
    return [subprocess.CompletedProcess(p.args, p.wait(timeout=240),
                                        (out / f"{r}.out").read_text(),
                                        (out / f"{r}.err").read_text())
            for r, p in enumerate(procs)]


def test_every_rank_exits_with_the_gate_status_and_rank_0_alone_reports(tmp_path):
    target = load_target(f"{TARGETS}:date_lstm")
    single = attnaudit.audit(target, checks_only=True, limit=12, progress=False,
                             row_sum_tolerance=0.0).gate()
    assert single.status == 1  # float32 rows never sum to exactly 1 everywhere
    junit = tmp_path / "check.xml"
    ranks = launch_by_hand(["check", f"{TARGETS}:date_lstm", "--limit", "12",
                            "--row-sum-tolerance", "0", "--json", "--junit", str(junit)],
                           tmp_path)
    assert [r.returncode for r in ranks] == [single.status] * 2, ranks[1].stderr[-2000:]
    payload = json.loads(ranks[0].stdout)
    assert payload == json.loads(single.to_json())
    assert ranks[1].stdout == "" and "audit date" not in ranks[1].stderr
    assert "audit date: validity" in ranks[0].stderr
    failures = ET.parse(junit).getroot().get("failures")
    assert failures == ET.fromstring(single.junit_xml(0.0)).get("failures") == "1"


def test_a_failing_rank_stops_the_job_and_is_named(tmp_path):
    started = time.perf_counter()
    result = torchrun("report", f"{TARGETS}:date_lstm_failing_on_rank_1", "--limit", "12",
                      "--quick", "--out", str(tmp_path / "out"), timeout=120)
    elapsed = time.perf_counter() - started
    assert result.returncode != 0
    assert "rank 1 of 2 failed during the validity audit" in result.stderr
    assert "deliberate failure in this rank's shard" in result.stderr
    assert not (tmp_path / "out").exists()  # no report, partial or otherwise
    assert elapsed < 120


def test_a_stuck_rank_is_given_up_after_the_collective_timeout():
    started = time.perf_counter()
    result = torchrun("check", f"{TARGETS}:date_lstm_stuck_on_rank_1", "--limit", "12",
                      timeout=120, ATTNAUDIT_DIST_TIMEOUT="5")
    elapsed = time.perf_counter() - started
    assert result.returncode != 0
    assert "attnaudit check: error: rank 0 of 2: another rank did not take part in a " \
        "collective" in result.stderr, result.stderr[-3000:]
    assert elapsed < 55  # rank 1 stalls for 60 s; rank 0 gives up 5 s after it waits
