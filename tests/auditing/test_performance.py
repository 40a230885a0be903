"""The performance item: repeated timings with their spread, memory only where measured,
and a status from thresholds the report states."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

import attnaudit
from attnaudit.checklist.performance import (
    CAPTURE_OVERHEAD_FAIL,
    CAPTURE_OVERHEAD_PASS,
    overhead_status,
    performance_item,
)
from attnaudit.runtime.measurement import (
    MAX_TIMING_REPEATS,
    MIN_TIMED_S,
    PERFORMANCE_COLUMNS,
    QUICK_TIMING_REPEATS,
    SLOW_PASS_S,
    TIMING_REPEATS,
    PeakMemory,
    repeat_count,
    spread,
)
from attnaudit.validity.pipeline import run_validity_audit
from attnaudit_examples.date.target import make_target as date_target

TIMES = ("greedy_s", "plain_s", "captured_s", "capture_overhead")


def test_every_time_is_a_median_of_repeated_runs():
    target = date_target(limit=20, batch_size=10)
    calls = {"greedy": 0, "teacher_forced": 0}

    def counted(name, fn):
        def call(*args):
            calls[name] += 1
            return fn(*args)
        return call

    counting = target.with_options(greedy=counted("greedy", target.greedy),
                                   teacher_forced=counted("teacher_forced",
                                                          target.teacher_forced))
    perf = run_validity_audit(counting, progress=False).performance
    assert list(perf.columns) == PERFORMANCE_COLUMNS and len(perf) == 2
    assert calls == {"greedy": perf["greedy_repeats"].sum(),
                     "teacher_forced": 2 * perf["repeats"].sum()}  # without and with capture
    for repeats in (perf["greedy_repeats"], perf["repeats"]):
        assert repeats.between(TIMING_REPEATS, MAX_TIMING_REPEATS).all()
    # a millisecond pass runs until its runs add up to MIN_TIMED_S (or the cap)
    longest = perf[["plain_s_max", "captured_s_max"]].max(axis=1)
    assert ((longest * perf["repeats"] >= MIN_TIMED_S)
            | (perf["repeats"] == MAX_TIMING_REPEATS)).all()
    for name in TIMES:
        assert (perf[f"{name}_min"] <= perf[name]).all()
        assert (perf[name] <= perf[f"{name}_max"]).all()
        assert (perf[f"{name}_min"] > 0).all()
    # the overhead's range is that of the per-run ratios: within the times' own ranges
    assert (perf["capture_overhead_max"] <= perf["captured_s_max"] / perf["plain_s_min"]).all()
    assert (perf["capture_overhead_min"] >= perf["captured_s_min"] / perf["plain_s_max"]).all()


@pytest.mark.parametrize("least", [QUICK_TIMING_REPEATS, TIMING_REPEATS])
def test_a_slow_pass_runs_as_often_as_asked_and_the_item_counts_them(least: int) -> None:
    """A pass that takes SLOW_PASS_S or longer (a billion-parameter model's) runs ``least``
    times: once in a quick audit, three times in a full one; the item's text says how many
    (its summary does not depend on the count: ranks of one audit time differently). A
    faster pass runs at least TIMING_REPEATS times whatever ``least`` is."""
    import time

    target = date_target(limit=4, batch_size=4)
    calls = {"greedy": 0, "teacher_forced": 0}

    def slow(name, fn):
        def call(*args):
            calls[name] += 1
            time.sleep(SLOW_PASS_S)
            return fn(*args)
        return call

    slowed = target.with_options(greedy=slow("greedy", target.greedy),
                                 teacher_forced=slow("teacher_forced", target.teacher_forced))
    audit = run_validity_audit(slowed, progress=False, timing_repeats=least)
    perf = audit.performance
    assert perf["greedy_repeats"].tolist() == [least] and perf["repeats"].tolist() == [least]
    assert calls == {"greedy": least, "teacher_forced": 2 * least}
    item = performance_item(audit)
    assert f"here {least} runs" in item.measured[0]
    assert repeat_count(SLOW_PASS_S / 2, least) == TIMING_REPEATS  # a faster pass: as ever
    assert repeat_count(SLOW_PASS_S, least) == least


def test_the_gate_audit_times_nothing():
    target = date_target(limit=10, batch_size=10)
    calls = []
    counting = target.with_options(teacher_forced=lambda b, e: calls.append(1)
                                   or target.teacher_forced(b, e))
    result = attnaudit.audit(counting, checks_only=True, progress=False)
    assert len(calls) == 1  # one captured pass, not timed
    assert result.validity.performance[list(TIMES)].isna().all().all()
    assert result.statuses["performance"] == "not recorded"


def test_cpu_memory_is_not_presented_as_a_measurement(tmp_path):
    result = attnaudit.audit(date_target(limit=10, batch_size=10), interventions=False,
                             progress=False)
    perf = result.tables["performance"]
    assert perf[["plain_peak_mib", "captured_peak_mib"]].isna().all().all()
    item = result.checklist.item("performance")
    assert any(line.startswith("Peak memory: not measured") for line in item.observations)
    assert not any("MiB without capture" in line for line in item.observations)
    page = result.save(tmp_path / "report").read_text(encoding="utf-8")
    assert "Peak memory: not measured" in page
    assert f"pass at most {CAPTURE_OVERHEAD_PASS:g}x, fail above {CAPTURE_OVERHEAD_FAIL:g}x" in page
    written = pd.read_csv(tmp_path / "report" / "performance.csv")
    assert written["plain_peak_mib"].isna().all()


def _performance(overheads: list[float]) -> SimpleNamespace:
    """A hand-built audit whose batches have these smallest per-round capture overheads."""
    rows = []
    for batch, overhead in enumerate(overheads):
        plain = 0.1
        row = dict.fromkeys(PERFORMANCE_COLUMNS, math.nan)
        row.update(batch=batch, examples=10, source_tokens=50, target_tokens=40, repeats=3,
                   greedy_repeats=3,
                   capture_mib=0.5, materialised_sites=0)
        for name, value in (("greedy_s", 0.2), ("plain_s", plain),
                            ("captured_s", plain * overhead), ("capture_overhead", overhead)):
            row.update({name: value, f"{name}_min": value * 0.9, f"{name}_max": value * 1.2})
        row["capture_overhead_min"] = overhead  # the judged statistic, exactly
        rows.append(row)
    sites = pd.DataFrame({"site": ["attend"], "scores_materialised_by_capture": [False]})
    return SimpleNamespace(performance=pd.DataFrame(rows, columns=PERFORMANCE_COLUMNS),
                           sites=sites)


@pytest.mark.parametrize(("overheads", "status"), [
    ([1.1, 1.3, 9.0], "pass"),  # the smallest over batches: 1.1
    ([CAPTURE_OVERHEAD_PASS], "pass"),
    ([CAPTURE_OVERHEAD_PASS * 1.01, 4.0], "warn"),
    ([CAPTURE_OVERHEAD_FAIL], "warn"),
    ([CAPTURE_OVERHEAD_FAIL * 1.01, 8.0], "fail"),
])
def test_status_follows_the_stated_thresholds(overheads, status):
    item = performance_item(_performance(overheads))
    assert item.status == status
    [line] = [line for line in item.observations if line.startswith("Capture overhead")]
    assert f"at least {min(overheads):.3g}x over {len(overheads)} batch(es): {status}" in line
    assert f"{status} (pass at most {CAPTURE_OVERHEAD_PASS:g}x, fail above " \
        f"{CAPTURE_OVERHEAD_FAIL:g}x). Spread with the machine's load" in line
    totals = item.evidence[1].frame.iloc[0]
    assert totals["plain_s"] == pytest.approx(0.1 * len(overheads))
    assert totals["plain_s_max"] == pytest.approx(0.12 * len(overheads))


def test_peak_memory_is_measured_on_cuda_only():
    with PeakMemory(torch.nn.Linear(2, 2)) as memory:
        block = torch.ones(25_000_000)  # 95.4 MiB of float32
        del block
    assert math.isnan(memory.peak_mib)  # CPU: not measured
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the allocator's peak is checked on one")
    with PeakMemory(torch.nn.Linear(2, 2).cuda()) as memory:
        block = torch.ones(25_000_000, device="cuda")
        del block
    assert memory.peak_mib == pytest.approx(25_000_000 * 4 / 2**20, rel=0.01)


def _rounds(plain: list[list[float]], captured: list[list[float]]) -> SimpleNamespace:
    """A hand-built audit from per-round times of each batch (seconds, paired by round)."""
    rows = []
    for batch, (p, c) in enumerate(zip(plain, captured, strict=True)):
        row = dict.fromkeys(PERFORMANCE_COLUMNS, math.nan)
        row.update(batch=batch, examples=10, source_tokens=50, target_tokens=40,
                   repeats=len(p), greedy_repeats=len(p), capture_mib=0.5,
                   materialised_sites=0,
                   **spread("greedy_s", p), **spread("plain_s", p), **spread("captured_s", c),
                   **spread("capture_overhead", [b / a for a, b in zip(p, c, strict=True)]))
        rows.append(row)
    sites = pd.DataFrame({"site": ["attend"], "scores_materialised_by_capture": [False]})
    return SimpleNamespace(performance=pd.DataFrame(rows, columns=PERFORMANCE_COLUMNS),
                           sites=sites)


def test_one_slow_round_does_not_change_the_judgement():
    """A round whose run with capture was slowed by load leaves the judged overhead and the
    status exactly as they were; one whose run without capture was slowed can only lower it
    (towards pass). The median of per-round ratios, which the item judged by before, moves
    from pass to warn on the same timings."""
    plain = [[0.10, 0.10, 0.10], [0.20, 0.20, 0.20]]
    captured = [[0.15, 0.19, 0.21], [0.30, 0.38, 0.42]]  # ratios 1.5, 1.9, 2.1
    calm = performance_item(_rounds(plain, captured))
    slowed = [[0.15, 0.90, 0.21], [0.30, 1.80, 0.42]]
    loaded = performance_item(_rounds(plain, slowed))
    assert loaded.status == calm.status == "pass"
    assert loaded.evidence[1].frame["capture_overhead_min"][0] == pytest.approx(1.5)
    assert _rounds(plain, slowed).performance["capture_overhead"].median() == \
        pytest.approx(2.1)  # over CAPTURE_OVERHEAD_PASS: the old statistic flips
    assert overhead_status(2.1) == "warn"
    [line] = [line for line in calm.observations if line.startswith("Capture overhead")]
    assert "at least 1.5x over 2 batch(es): pass" in line
    assert "median 1.9x, largest 2.1x" in line
    # a model over the threshold in every round warns, with or without one slowed round
    costly = [[0.25, 0.29, 0.31], [0.50, 0.58, 0.62]]  # ratios 2.5, 2.9, 3.1
    for c in (costly, [[0.25, 0.90, 0.31], [0.50, 1.80, 0.62]]):
        assert performance_item(_rounds(plain, c)).status == "warn"
