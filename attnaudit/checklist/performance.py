"""The checklist's performance item: latency, throughput and memory of capture, judged by
the smallest capture overhead over the timed rounds (:data:`CAPTURE_OVERHEAD_PASS`,
:data:`CAPTURE_OVERHEAD_FAIL`).

Each round times the teacher-forced pass with and without capture back to back; load on the
machine slows one or the other, so the per-round ratio scatters (0.78x to 6.3x on one
report), and a median of it went from pass to warn between two runs a minute apart, and
between a one-process and a torchrun launch of the same model. The smallest ratio is moved
by load only downwards: the item warns or fails only when every round measured capture
above the threshold. The median and the largest ratio are shown beside it, as the spread.
"""

from __future__ import annotations

import pandas as pd

from attnaudit.checklist.items import (
    FAIL,
    ITEM_BY_KEY,
    PASS,
    WARN,
    Evidence,
    ItemResult,
    missing_item,
)
from attnaudit.runtime.measurement import (
    MAX_TIMING_REPEATS,
    MIN_TIMED_S,
    QUICK_TIMING_REPEATS,
    SLOW_PASS_S,
    TIMING_REPEATS,
)
from attnaudit.validity.result import ValidityAudit

# The performance item's thresholds on the capture overhead: the smallest over every batch's
# rounds of (teacher-forced time with capture) / (without), see the module docstring.
CAPTURE_OVERHEAD_PASS = 2.0  # at most: pass
CAPTURE_OVERHEAD_FAIL = 5.0  # above: fail; in between: warn


def performance_totals(perf: pd.DataFrame) -> dict[str, float]:
    """One row of totals from the per-batch performance table: times are sums of each
    batch's median (``*_min`` / ``*_max``: sums of its fastest / slowest run), the capture
    overhead is the median of the batches' medians with the range of single rounds
    (``capture_overhead_min``, the smallest, is what the status is judged by), memory the
    largest batch's."""
    valid_tokens = int(perf["source_tokens"].sum() + perf["target_tokens"].sum())
    totals: dict[str, float] = {"examples": int(perf["examples"].sum()),
                                "greedy_repeats": int(perf["greedy_repeats"].sum()),
                                "repeats": int(perf["repeats"].sum()),
                                "valid_tokens": valid_tokens}
    for name in ("greedy_s", "plain_s", "captured_s"):
        for column in (name, f"{name}_min", f"{name}_max"):
            totals[column] = float(perf[column].sum(min_count=1))
    totals["tokens_per_s_plain"] = valid_tokens / totals["plain_s"]
    totals["capture_overhead"] = float(perf["capture_overhead"].median())
    totals["capture_overhead_min"] = float(perf["capture_overhead_min"].min())
    totals["capture_overhead_max"] = float(perf["capture_overhead_max"].max())
    for column in ("plain_peak_mib", "captured_peak_mib", "capture_mib"):
        totals[f"{column}_max"] = float(perf[column].max())
    return totals


def overhead_status(overhead: float) -> str:
    """pass / warn / fail for a capture overhead (see :data:`CAPTURE_OVERHEAD_PASS`)."""
    if overhead <= CAPTURE_OVERHEAD_PASS:
        return PASS
    return FAIL if overhead > CAPTURE_OVERHEAD_FAIL else WARN


def performance_item(audit: ValidityAudit) -> ItemResult:
    """The performance item from the audit's performance table (one row per batch,
    :mod:`attnaudit.validity.timing`) and the sites whose scores capture materialised;
    not recorded when no pass was timed."""
    perf = audit.performance
    if perf.empty or perf["plain_s"].isna().all():
        return missing_item(ITEM_BY_KEY["performance"],
                            "no pass was timed (the gate's checks-only audit times nothing)")
    totals = performance_totals(perf)
    batches = len(perf)
    counts = pd.concat([perf["greedy_repeats"], perf["repeats"]])
    repeats = (f"{counts.min()}" if counts.min() == counts.max()
               else f"{counts.min()} to {counts.max()}")
    overhead = totals["capture_overhead_min"]
    materialised = audit.sites.loc[audit.sites["scores_materialised_by_capture"], "site"]
    measured_memory = perf[["plain_peak_mib", "captured_peak_mib"]].notna().any().any()
    observations = [
        f"Teacher-forced forward without capture: {totals['plain_s']:.3g} s for "
        f"{totals['examples']} examples (fastest to slowest runs: {totals['plain_s_min']:.3g}"
        f"-{totals['plain_s_max']:.3g} s), {totals['tokens_per_s_plain']:.4g} valid tokens/s; "
        f"with capture {totals['captured_s']:.3g} s ({totals['captured_s_min']:.3g}"
        f"-{totals['captured_s_max']:.3g} s); greedy decoding {totals['greedy_s']:.3g} s "
        f"({totals['greedy_s_min']:.3g}-{totals['greedy_s_max']:.3g} s).",
        f"Capture overhead (time with capture / without, per round): at least "
        f"{overhead:.3g}x over {batches} batch(es): {overhead_status(overhead)} (pass at "
        f"most {CAPTURE_OVERHEAD_PASS:g}x, fail above {CAPTURE_OVERHEAD_FAIL:g}x). Spread "
        f"with the machine's load: median {totals['capture_overhead']:.3g}x, largest "
        f"{totals['capture_overhead_max']:.3g}x.",
        (f"Peak memory above the starting level (CUDA allocator): "
         f"{totals['plain_peak_mib_max']:.3g} MiB without capture, "
         f"{totals['captured_peak_mib_max']:.3g} MiB with." if measured_memory else
         "Peak memory: not measured (CUDA only; on CPU no allocator statistic exists)."),
        f"Capture held up to {totals['capture_mib_max']:.3g} MiB of tensors at once per "
        "batch (exact: the largest call, each analysed as it arrived and dropped).",
        (f"Score matrices materialised only because capture computed them explicitly: "
         f"{', '.join(materialised)}." if len(materialised) else
         "No site needed capture to materialise a score matrix the model would not have "
         "formed itself (softmax-path sites compute weights explicitly)."),
    ]
    return ItemResult(
        ITEM_BY_KEY["performance"], overhead_status(overhead),
        "Latency and valid-token throughput measured per batch on this machine, each time "
        f"the median of at least {TIMING_REPEATS} runs ({QUICK_TIMING_REPEATS} of a pass of "
        f"{SLOW_PASS_S:g} s or longer in a quick audit); judged by the capture overhead.",
        measured=[f"Per batch, greedy decoding and the teacher-forced forward without and "
                  f"with capture (alternating which runs first) were each run at least "
                  f"{TIMING_REPEATS} times ({QUICK_TIMING_REPEATS} of a pass of "
                  f"{SLOW_PASS_S:g} s or longer in a quick audit), and "
                  f"more while the runs added up to less than {MIN_TIMED_S:g} s (at most "
                  f"{MAX_TIMING_REPEATS}): here {repeats} runs. "
                  "Every time shown is the median of its runs with the fastest and slowest; "
                  "valid tokens = real source tokens + emitted steps up to EOS.",
                  "Status from the smallest capture overhead over every round (load "
                  "scatters the per-round ratio and moves its smallest only downwards, so "
                  "the item warns or fails only when every round measured capture above "
                  f"the threshold): pass at most {CAPTURE_OVERHEAD_PASS:g}x, warn up to "
                  f"{CAPTURE_OVERHEAD_FAIL:g}x, fail above.",
                  "Peak memory above the level at entry: the CUDA allocator's peak; not "
                  "measured on other devices."],
        observations=observations,
        not_recorded=[] if measured_memory else [
            "Peak memory: not measured on this device (the peak resident set size of a "
            "CPU process misses allocations served from memory it already holds)."],
        evidence=[Evidence("performance", "Performance per batch",
                           "Seconds (median of the batch's runs, with the fastest and "
                           "slowest; greedy_repeats and repeats count them), "
                           "MiB (empty: not measured) and valid tokens per second; absolute "
                           "numbers depend on the machine and its load.", perf),
                  Evidence("performance_totals", "Performance totals",
                           "Sums over batches of the per-batch medians (and of the fastest "
                           "and slowest runs); the overhead is the median over batches, "
                           "with the smallest (judged) and largest single round; peaks are "
                           "the largest batch's.", pd.DataFrame([totals]))],
    )
