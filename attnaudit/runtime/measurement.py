"""Measurement: wall time, peak memory and the size of what capture kept.

The validity audit's performance table (one row per batch, :data:`PERFORMANCE_COLUMNS`) is
built from these; see :mod:`attnaudit.validity.timing` for what each column means.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from attnaudit.record import AttentionRecord
from attnaudit.targets.placement import input_device

# Each timed pass runs at least TIMING_REPEATS times, and more (up to MAX_TIMING_REPEATS)
# while its runs add up to less than MIN_TIMED_S, so that millisecond passes are not judged
# on three noisy readings; the table shows the median and the range. A quick audit asks for
# at least QUICK_TIMING_REPEATS runs of a pass whose first run took SLOW_PASS_S or longer (a
# billion-parameter model's: one), and as many of a faster one as a full audit does.
TIMING_REPEATS = 3
QUICK_TIMING_REPEATS = 1
SLOW_PASS_S = 0.5
MAX_TIMING_REPEATS = 25
MIN_TIMED_S = 0.25

PERFORMANCE_COLUMNS = ["batch", "examples", "source_tokens", "target_tokens",
                       "greedy_repeats", "greedy_s", "greedy_s_min", "greedy_s_max",
                       "repeats", "plain_s", "plain_s_min", "plain_s_max",
                       "captured_s", "captured_s_min", "captured_s_max",
                       "capture_overhead", "capture_overhead_min", "capture_overhead_max",
                       "tokens_per_s_plain", "tokens_per_s_captured", "plain_peak_mib",
                       "captured_peak_mib", "capture_mib", "materialised_sites"]


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, NaN when the denominator is not positive."""
    return numerator / denominator if denominator > 0 else math.nan


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """(fn(), its wall time in seconds)."""
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def least_repeats(quick: bool) -> int:
    """The fewest timed runs of a slow pass in a quick (``quick``) or full audit."""
    return QUICK_TIMING_REPEATS if quick else TIMING_REPEATS


def repeat_count(first_s: float, least: int = TIMING_REPEATS) -> int:
    """How many runs to time of a pass whose first run took ``first_s`` seconds: at least
    ``least`` when it took :data:`SLOW_PASS_S` or longer, else at least
    :data:`TIMING_REPEATS`, and more while they add up to less than :data:`MIN_TIMED_S`."""
    wanted = math.ceil(MIN_TIMED_S / first_s) if first_s > 0 else MAX_TIMING_REPEATS
    fewest = least if first_s >= SLOW_PASS_S else TIMING_REPEATS
    return min(max(wanted, fewest), MAX_TIMING_REPEATS)


def spread(name: str, values: Sequence[float]) -> dict[str, float]:
    """``{name: median, name_min: smallest, name_max: largest}`` of repeated measurements
    (all NaN when there is none)."""
    if not values:
        return {name: math.nan, f"{name}_min": math.nan, f"{name}_max": math.nan}
    return {name: statistics.median(values), f"{name}_min": min(values),
            f"{name}_max": max(values)}


class PeakMemory:
    """Peak memory in MiB above the level at entry, while the block ran.

    Measured for CUDA models only, from the allocator's peak. Elsewhere ``peak_mib`` stays
    NaN ("not measured"): on CPU no allocator statistic exists, and the peak resident set
    size misses every allocation served from memory the process already holds, so it reads
    0 after the first batch whatever the model allocates.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.device = input_device(model)
        self.peak_mib = math.nan
        self._base: float | None = None

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._base is None:
            return
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device)
        self.peak_mib = max(peak - self._base, 0) / 2**20


def capture_bytes(records: Iterable[AttentionRecord]) -> int:
    """Bytes of every tensor capture kept in ``records`` (weights, scores, values)."""
    total = 0
    for record in records:
        for call in record.calls:
            for t in (call.weights, call.scores, call.values):
                if t is not None:
                    total += t.numel() * t.element_size()
    return total
