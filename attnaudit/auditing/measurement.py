"""Measurement: wall time, peak memory and the size of what capture kept.

The validity audit's performance table (one row per batch, :data:`PERFORMANCE_COLUMNS`) is
built from these; see :func:`attnaudit.auditing.validity.run_validity_audit` for what each
column means.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from attnaudit.record import AttentionRecord

PERFORMANCE_COLUMNS = ["batch", "examples", "source_tokens", "target_tokens", "greedy_s",
                       "plain_s", "captured_s", "capture_overhead", "tokens_per_s_plain",
                       "tokens_per_s_captured", "plain_peak_mib", "captured_peak_mib",
                       "capture_mib", "materialised_sites"]


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, NaN when the denominator is not positive."""
    return numerator / denominator if denominator > 0 else math.nan


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """(fn(), its wall time in seconds)."""
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


class PeakMemory:
    """Peak memory in MiB above the level at entry, while the block ran.

    CUDA models: the allocator's peak. CPU: peak resident set size on Linux (reset through
    /proc/self/clear_refs), a lower bound, since the allocator reuses freed memory without
    growing the RSS; NaN where neither can be read.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        param = next(model.parameters(), None)
        self.device = param.device if param is not None else torch.device("cpu")
        self.peak_mib = math.nan
        self._base: float | None = None

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        elif _reset_peak_rss():
            self._base = _proc_status_kib("VmRSS") * 1024
        return self

    def __exit__(self, *exc: object) -> None:
        if self._base is None:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
        else:
            peak = _proc_status_kib("VmHWM") * 1024
        self.peak_mib = max(peak - self._base, 0) / 2**20


def _reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _proc_status_kib(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return float(line.split()[1])
    return math.nan


def capture_bytes(records: Iterable[AttentionRecord]) -> int:
    """Bytes of every tensor capture kept in ``records`` (weights, scores, values)."""
    total = 0
    for record in records:
        for call in record.calls:
            for t in (call.weights, call.scores, call.values):
                if t is not None:
                    total += t.numel() * t.element_size()
    return total
