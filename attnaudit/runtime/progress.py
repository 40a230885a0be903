"""One progress display per command, with an overall estimate of the time left.

:func:`display` opens the display of a whole job: ``examples`` per pass, over ``passes``
passes (an audit makes a validity pass and an intervention pass over the same examples).
Inside it, :func:`advance` moves it on as examples are done, :func:`phase` names what runs
(the count shown is the phase's own: ``interventions: 3/4 examples``, never the passes
added up), and a :class:`Counter` (one per intervention protocol, in edited sequences)
shows its count beside it instead of drawing a bar of its own; after :func:`split`, the
next counters also move the display on, each by its share of a batch, and :func:`settle`
adds what they left. A :func:`display` opened inside another joins it, so a job's parts
each open one and the outermost decides.

The time left follows the job's plan (:mod:`attnaudit.auditing.plan`) when one is given:
:func:`expect` declares a part's units (the validity pass's examples, a protocol's edited
items) with an estimated time per unit, :func:`part` marks the time spent on one part, and
the estimate is the sum over every part of its units left times its time per unit, measured
once the part has run (estimated ones are scaled by how far measured parts of the same unit ran
from their estimates). Without a plan it is the phase's average rate over the units left.

On a terminal the display is a tqdm bar redrawn in place. When stderr is not a terminal (a
log file, CI) it writes whole lines only, no carriage returns: one when a phase starts, at
most one every :data:`LOG_INTERVAL_S` seconds in between, and with a plan one when the job
ends, with each part's count done and the time it took (``done: ...; permutation 80 items
in 00:03, ...``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TextIO

from tqdm.auto import tqdm

LOG_INTERVAL_S = 30.0
REDRAW_S = 0.5  # on a terminal: the shortest interval between two redraws
LINE_FORMAT = "{desc}: {n:.0f}/{total:.0f} {unit} [{elapsed} elapsed, {remaining} left]"
OPEN_LINE_FORMAT = "{desc}: {n:.0f} {unit} [{elapsed} elapsed]"  # no total known
BAR_FORMAT = ("{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total_fmt} "
              "[{elapsed}{postfix}]")


@dataclass
class _Part:
    """One part of a plan: ``planned`` units, ``done`` so far in ``seconds``; ``estimate``:
    the planned seconds per unit (None: unknown)."""

    planned: float
    estimate: float | None
    unit: str
    done: float = 0.0
    seconds: float = 0.0

    def rate(self) -> float | None:
        return self.seconds / self.done if self.done > 0 and self.seconds > 0 else None


class Display:
    """A job's progress on ``stream``: ``total`` units per phase (module docstring)."""

    def __init__(self, total: float | None, unit: str, name: str, stream: TextIO,
                 phases: int = 1) -> None:
        self.total, self.unit, self.name, self.stream = total, unit, name, stream
        self.phases, self.phases_started = phases, 0
        self.done = 0.0  # in the current phase
        self.what = ""
        self.share = self.unsettled = 0.0  # see split()
        self.started = self._last_line = self._phase_started = time.perf_counter()
        self.parts: dict[str, _Part] = {}
        self.current: str | None = None
        self._mark = self.started
        self.bar: tqdm | None = None
        if stream.isatty():
            self.bar = tqdm(total=total, unit=unit, desc=name, file=stream,
                            dynamic_ncols=True, mininterval=REDRAW_S, leave=False,
                            bar_format=BAR_FORMAT if total is not None else None)

    def expect(self, name: str, units: float, estimate: float | None, unit: str) -> None:
        """Part ``name`` of the plan: ``units`` in all, ``estimate`` seconds each."""
        part = self.parts.get(name)
        if part is None:
            self.parts[name] = _Part(float(units), estimate, unit)
        else:
            part.planned = max(float(units), part.done)
            part.estimate = estimate if estimate is not None else part.estimate

    def enter(self, name: str | None) -> str | None:
        """Time from now on goes to part ``name``; returns the part it left."""
        self._charge()
        if name is not None and name not in self.parts:
            self.parts[name] = _Part(0.0, None, "items")  # a part of unknown size
        left, self.current = self.current, name
        return left

    def work(self, units: float) -> None:
        """``units`` of the current part done."""
        if self.current is not None and self.current in self.parts:
            self._charge()
            self.parts[self.current].done += units

    def _charge(self) -> None:
        now = time.perf_counter()
        if self.current is not None and self.current in self.parts:
            self.parts[self.current].seconds += now - self._mark
        self._mark = now

    def remaining(self) -> float | None:
        """Seconds left (module docstring); None when nothing is known yet."""
        if not self.parts:
            if self.total is None or self.done <= 0:
                return None
            average = (time.perf_counter() - self._phase_started) / self.done
            later = self.total * max(self.phases - self.phases_started, 0)
            return (max(self.total - self.done, 0.0) + later) * average
        self._charge()
        left, known = 0.0, False
        for part in self.parts.values():
            units = max(part.planned - part.done, 0.0)
            rate = part.rate()
            if rate is None and part.estimate is not None:
                rate = part.estimate * self._scale(part.unit)
            if rate is not None:
                left, known = left + units * rate, True
        return left if known else None

    def _scale(self, unit: str) -> float:
        """Measured over estimated seconds of the parts in ``unit`` that have run (1.0
        before any has): how far the plan's estimates are off on this machine now."""
        measured = [p for p in self.parts.values() if p.unit == unit and p.rate() is not None
                    and p.estimate is not None and p.estimate > 0]
        planned = sum(p.done * (p.estimate or 0.0) for p in measured)
        return sum(p.seconds for p in measured) / planned if planned > 0 else 1.0

    def advance(self, units: float) -> None:
        self.done += units
        self.work(units)
        if self.bar is not None:
            self.bar.update(units)
            self._postfix()
        else:
            self._line(force=False)

    def split(self, units: float, parts: int) -> None:
        """The next ``parts`` counters move the display on by ``units`` between them."""
        self.settle()
        self.unsettled, self.share = float(units), units / max(parts, 1)

    def credit(self, units: float) -> None:
        """A counter's progress, within what :meth:`split` left unsettled."""
        units = min(units, self.unsettled)
        if units > 0:
            self.unsettled -= units
            self.done += units
            if self.bar is not None:
                self.bar.update(units)
            else:
                self._line(force=False)

    def settle(self) -> None:
        """The rest of the last :meth:`split`, when its counters are done."""
        self.credit(self.unsettled)

    def phase(self, what: str) -> None:
        if what != self.what:
            self.phases_started += 1
            self.done, self._phase_started = 0.0, time.perf_counter()
            if self.bar is not None:
                self.bar.reset(total=self.total)
        self.what = what
        if self.bar is not None:
            self.bar.set_description_str(f"{self.name}: {what}")
        else:
            self._line(force=True)

    def detail(self, text: str) -> None:
        """A count within the phase, shown beside the bar (or on the next log line)."""
        if self.bar is not None:
            self._postfix(text)
        else:
            self._line(force=False, detail=text)

    def close(self) -> None:
        self._charge()
        if self.bar is not None:
            self.bar.close()
        elif self.parts:
            counts = [f"{name} {part.done:.0f} {part.unit} in "
                      f"{tqdm.format_interval(part.seconds)}" for name, part in self.parts.items()]
            elapsed = tqdm.format_interval(time.perf_counter() - self.started)
            print(f"{self.name}: done [{elapsed} elapsed]; " + ", ".join(counts),
                  file=self.stream, flush=True)

    def _left(self) -> str:
        left = self.remaining()
        return "?" if left is None else tqdm.format_interval(left)

    def _postfix(self, text: str | None = None) -> None:
        assert self.bar is not None
        now = time.perf_counter()
        redraw = now - self._last_line >= REDRAW_S
        if redraw:
            self._last_line = now
        self._detail = getattr(self, "_detail", "") if text is None else text
        shown = ", ".join(part for part in (f"{self._left()} left", self._detail) if part)
        self.bar.set_postfix_str(shown, refresh=redraw)

    def _line(self, *, force: bool, detail: str = "") -> None:
        now = time.perf_counter()
        if not force and now - self._last_line < LOG_INTERVAL_S:
            return
        self._last_line = now
        desc = f"{self.name}: {self.what}" if self.what else self.name
        elapsed = tqdm.format_interval(now - self.started)
        if self.total is None:
            text = OPEN_LINE_FORMAT.format(desc=desc, n=self.done, unit=self.unit,
                                           elapsed=elapsed)
        else:
            text = LINE_FORMAT.format(desc=desc, n=self.done, total=self.total,
                                      unit=self.unit, elapsed=elapsed, remaining=self._left())
        print(text + (f"; {detail}" if detail else ""), file=self.stream, flush=True)


_open: Display | None = None


@contextmanager
def display(examples: int | None, passes: int = 1, *, enabled: bool,
            name: str = "attnaudit", unit: str = "examples",
            stream: TextIO | None = None) -> Iterator[None]:
    """The job's display for ``examples`` per pass, over ``passes`` passes (None: not known,
    no time left is estimated) while the block runs; nothing when not ``enabled``; the open
    display when one is open already."""
    global _open
    if _open is not None or not enabled:
        yield
        return
    _open = Display(examples, unit, name, stream or sys.stderr, phases=passes)
    try:
        yield
    finally:
        _open.close()
        _open = None


def advance(units: float) -> None:
    """``units`` more done (no-op without an open display)."""
    if _open is not None:
        _open.advance(units)


def split(units: float, parts: int) -> None:
    """The next ``parts`` counters (:class:`Counter`) share ``units`` of progress, each in
    proportion to its own count; :func:`settle` adds what they left (no-op without an open
    display)."""
    if _open is not None:
        _open.split(units, parts)


def settle() -> None:
    """Add the progress the last :func:`split` has not given yet."""
    if _open is not None:
        _open.settle()


def expect(name: str, units: float, estimate: float | None = None,
           unit: str = "items") -> None:
    """Part ``name`` of the job's plan: ``units`` in all (a later call for the same part
    replaces its count, never below what is done), ``estimate`` seconds each (None: not
    known until the part runs); no-op without an open display."""
    if _open is not None:
        _open.expect(name, units, estimate, unit)


def done_in(name: str) -> float:
    """The units of part ``name`` done so far (0 without an open display or such a part)."""
    found = _open.parts.get(name) if _open is not None else None
    return found.done if found is not None else 0.0


@contextmanager
def part(name: str) -> Iterator[None]:
    """The block's time and its :func:`advance` and :class:`Counter` units go to part
    ``name`` of the plan (:func:`expect`); no-op without an open display."""
    if _open is None:
        yield
        return
    shown, left = _open, _open.enter(name)
    try:
        yield
    finally:
        shown.enter(left)


def phase(what: str) -> None:
    """Name what runs now (no-op without an open display)."""
    if _open is not None:
        _open.phase(what)


class Counter:
    """A count of ``total`` items within the open display's phase (tqdm's ``update`` and
    ``total``), shown beside it and moving it on by its share of the last :func:`split`;
    silent when disabled or when no display is open."""

    def __init__(self, total: int, what: str, enabled: bool) -> None:
        self.total, self.what, self.n = total, what, 0
        self._display = _open if enabled else None
        self._share = self._display.share if self._display is not None else 0.0
        self._credited = 0.0
        self._show()

    def update(self, n: int = 1) -> None:
        self.n += n
        if self._display is not None:
            self._display.work(n)
        self._show()
        if self.total > 0:
            self._credit(self._share * min(self.n / self.total, 1.0))

    def __enter__(self) -> Counter:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._display is not None:
            self._credit(self._share)
            self._display.detail("")

    def _show(self) -> None:
        if self._display is not None:
            self._display.detail(f"{self.what} {self.n}/{self.total}")

    def _credit(self, upto: float) -> None:
        if self._display is not None and upto > self._credited:
            self._display.credit(upto - self._credited)
            self._credited = upto
