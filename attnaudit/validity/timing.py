"""The validity audit's passes over one batch, timed, and the performance row they give.

The performance table has one row per batch, its columns
:data:`attnaudit.runtime.measurement.PERFORMANCE_COLUMNS`: examples; real source tokens and
emitted steps up to EOS; with timing, greedy decoding (``greedy_repeats`` times) and the
teacher-forced forward without and with capture (``repeats`` times each, alternating which
runs first) are timed repeatedly (:func:`~attnaudit.runtime.measurement.repeat_count`; a
quick audit asks for fewer runs of a slow pass), and
each time is the median with its smallest and largest value (``*_s``, ``*_s_min``,
``*_s_max``); capture_overhead = captured / plain per repeat, its median and range; valid
tokens (source + target) per second from the medians; peak memory above the level before
the first pass in MiB, measured for CUDA models from the allocator and NaN (not measured)
elsewhere; capture_mib, the exact size of the tensors capture kept (streaming, where
capture keeps nothing: of the largest call it handed over at once); sites whose score
matrix capture materialised. Without timing every time is NaN.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from attnaudit.capturing import Capture, capture
from attnaudit.capturing.recorder import OnCall
from attnaudit.runtime.measurement import (
    TIMING_REPEATS,
    PeakMemory,
    ratio,
    repeat_count,
    spread,
    timed,
)
from attnaudit.targets.contract import Batch, Seq2SeqTarget


@dataclass
class TimedPasses:
    """Seconds of each timed teacher-forced pass without and with capture (paired by
    repeat) and the peak memory of the first of each (NaN: not measured); with
    ``keep_logits``, the logits (B, T, V) of one teacher-forced pass (the first one without
    capture, else the analysed one), for a comparison that needs them."""

    plain: list[float] = field(default_factory=list)
    captured: list[float] = field(default_factory=list)
    plain_peak_mib: float = math.nan
    captured_peak_mib: float = math.nan
    logits: torch.Tensor | None = None

    def overheads(self) -> list[float]:
        """captured / plain per repeat."""
        return [ratio(c, p) for c, p in zip(self.captured, self.plain, strict=True)]


def greedy_timed(target: Seq2SeqTarget, batch: Batch, timing: bool,
                 least: int = TIMING_REPEATS, known: tuple[torch.Tensor, float] | None = None
                 ) -> tuple[torch.Tensor, list[float]]:
    """The greedy output (B, T) and, with ``timing``, the seconds of each of as many runs
    (at least ``least``) as :func:`~attnaudit.runtime.measurement.repeat_count` asks for
    the first (else []); ``known``: the output and seconds of a run the caller already
    timed on this batch, which counts as the first."""
    emitted, first_s = known if known is not None else timed(lambda: _greedy(target, batch))
    if not timing:
        return emitted, []
    return emitted, [first_s, *(timed(lambda: _greedy(target, batch))[1]
                                for _ in range(repeat_count(first_s, least) - 1))]


def _greedy(target: Seq2SeqTarget, batch: Batch) -> torch.Tensor:
    with torch.no_grad():
        return target.greedy(batch)



@dataclass
class PlainPass:
    """One timed teacher-forced pass without capture: its seconds, its peak memory (MiB;
    NaN: not measured, :class:`~attnaudit.runtime.measurement.PeakMemory`) and, when kept,
    its logits (B, T, V)."""

    seconds: float
    peak_mib: float
    logits: torch.Tensor | None = None


def plain_pass(target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor, *,
               keep_logits: bool) -> PlainPass:
    """Run and time one teacher-forced pass over ``batch`` without capture (no gradients)."""
    with torch.no_grad(), PeakMemory(target.model) as memory:
        logits, seconds = timed(lambda: target.teacher_forced(batch, emitted))
    return PlainPass(seconds, memory.peak_mib, logits if keep_logits else None)


def forward_passes(target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor, *,
                   keep: bool, timing: bool, plain_first: bool,
                   on_call: OnCall | None = None, max_memory: int | None = None,
                   keep_logits: bool = False, least: int = TIMING_REPEATS,
                   known_plain: PlainPass | None = None) -> tuple[Capture, TimedPasses]:
    """The teacher-forced pass under capture whose records are analysed (``keep``: scores
    and values too) and, with ``timing``, timed passes without and with capture, as many
    of each (at least ``least``) as :func:`~attnaudit.runtime.measurement.repeat_count`
    asks for the first one, alternating which runs first so that warm-up favours neither;
    the analysed pass is the first timed one with capture. With ``on_call`` the analysed
    pass streams its calls to it and keeps none (its time then includes that analysis), and
    the other captured passes keep none either. ``max_memory``: the capture's block budget.
    ``keep_logits``: keep one pass's logits in the returned :class:`TimedPasses`.
    ``known_plain``: a pass without capture the caller already ran on this batch (the
    audit's plan), which counts as the first one without capture when it kept its logits
    or none are asked for."""
    passes = TimedPasses()
    if known_plain is not None and keep_logits and known_plain.logits is None:
        known_plain = None
    kept: Capture | None = None
    repeats = 1
    repeat = 0
    while repeat < repeats:
        for captured in ((False, True) if plain_first != (repeat % 2 == 1) else (True, False)):
            if captured:
                with PeakMemory(target.model) as memory:
                    start = time.perf_counter()
                    analysed = on_call if kept is None else None
                    with capture(target.model, target.sites, kinds=target.kinds,
                                 scores=keep, values=keep, on_call=analysed,
                                 keep=on_call is None, max_memory=max_memory) as cap:
                        logits = target.teacher_forced(batch, emitted)
                    passes.captured.append(time.perf_counter() - start)
                if kept is None:
                    kept, passes.captured_peak_mib = cap, memory.peak_mib
                    if keep_logits and passes.logits is None:
                        passes.logits = logits
                del logits  # not alive through the next pass
            elif timing:
                plain = known_plain if known_plain is not None and not passes.plain else \
                    plain_pass(target, batch, emitted, keep_logits=keep_logits)
                passes.plain.append(plain.seconds)
                if len(passes.plain) == 1:
                    passes.plain_peak_mib = plain.peak_mib
                    if keep_logits:  # a pass without capture: the model's own numbers
                        passes.logits = plain.logits
                del plain
        if timing and repeat == 0:
            repeats = repeat_count(max(passes.plain[0], passes.captured[0]), least)
        repeat += 1
    if not timing:
        passes.captured.clear()  # one untimed pass: no timing is reported from it
    assert kept is not None
    return kept, passes


def kept_pass(target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor, *, keep: bool,
              max_memory: int | None) -> Capture:
    """One untimed teacher-forced pass whose records are kept (``keep``: scores and values
    too)."""
    with capture(target.model, target.sites, kinds=target.kinds, scores=keep, values=keep,
                 max_memory=max_memory) as cap:
        target.teacher_forced(batch, emitted)
    return cap


def performance_row(index: int, batch: Batch, step_mask: torch.Tensor,
                    greedy_times: list[float], passes: TimedPasses, kept_bytes: int,
                    materialised: int) -> dict[str, Any]:
    """Batch ``index``'s row of the performance table (see the module docstring);
    ``step_mask``: bool (B, T), the emitted steps up to EOS; ``kept_bytes``: what capture
    kept in the analysed pass (streaming: the largest call it handed over);
    ``materialised``: sites whose score matrix capture computed."""
    source_tokens, target_tokens = int(batch.source_mask.sum()), int(step_mask.sum())
    times = {**spread("greedy_s", greedy_times), **spread("plain_s", passes.plain),
             **spread("captured_s", passes.captured),
             **spread("capture_overhead", passes.overheads())}
    return {
        "batch": index, "examples": len(batch), "source_tokens": source_tokens,
        "target_tokens": target_tokens, "greedy_repeats": len(greedy_times),
        "repeats": len(passes.plain), **times,
        "tokens_per_s_plain": ratio(source_tokens + target_tokens, times["plain_s"]),
        "tokens_per_s_captured": ratio(source_tokens + target_tokens, times["captured_s"]),
        "plain_peak_mib": passes.plain_peak_mib,
        "captured_peak_mib": passes.captured_peak_mib,
        "capture_mib": kept_bytes / 2**20,
        "materialised_sites": materialised,
    }
