"""One progress display per command, with an overall estimate of the time left.

:func:`display` opens the display of a whole job: ``examples`` times ``passes`` units (an
audit makes a validity pass and an intervention pass over the same examples). Inside it,
:func:`advance` moves it on as examples are done, :func:`phase` names what runs, and a
:class:`Counter` (one per intervention protocol, in edited sequences) shows its count
beside it instead of drawing a bar of its own; after :func:`split`, the next counters
also move the display on, each by its share of a batch, and :func:`settle` adds what they
left. A :func:`display` opened inside another joins it, so a job's parts each open one and
the outermost decides.

On a terminal the display is a tqdm bar redrawn in place, and the time left is tqdm's
estimate from the recent rate. When stderr is not a terminal (a log file, CI) it writes
whole lines only, no carriage returns: one when a phase starts and at most one every
:data:`LOG_INTERVAL_S` seconds in between, with the time left at the average rate so far.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from tqdm.auto import tqdm

LOG_INTERVAL_S = 30.0
REDRAW_S = 0.5  # on a terminal: the shortest interval between two redraws
LINE_FORMAT = "{desc}: {n:.0f}/{total:.0f} {unit} [{elapsed} elapsed, {remaining} left]"
OPEN_LINE_FORMAT = "{desc}: {n:.0f} {unit} [{elapsed} elapsed]"  # no total known
BAR_FORMAT = ("{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total_fmt} "
              "[{elapsed}<{remaining}{postfix}]")


class Display:
    """A job's progress on ``stream``: ``total`` units (see the module docstring)."""

    def __init__(self, total: float | None, unit: str, name: str, stream: TextIO) -> None:
        self.total, self.unit, self.name, self.stream = total, unit, name, stream
        self.done = 0.0
        self.what = ""
        self.share = self.unsettled = 0.0  # see split()
        self.started = self._last_line = time.perf_counter()
        self.bar: tqdm | None = None
        if stream.isatty():
            self.bar = tqdm(total=total, unit=unit, desc=name, file=stream,
                            dynamic_ncols=True, mininterval=REDRAW_S, leave=False,
                            bar_format=BAR_FORMAT if total is not None else None)

    def advance(self, units: float) -> None:
        self.done += units
        if self.bar is not None:
            self.bar.update(units)
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
            self.advance(units)

    def settle(self) -> None:
        """The rest of the last :meth:`split`, when its counters are done."""
        self.credit(self.unsettled)

    def phase(self, what: str) -> None:
        self.what = what
        if self.bar is not None:
            self.bar.set_description_str(f"{self.name}: {what}")
        else:
            self._line(force=True)

    def detail(self, text: str) -> None:
        """A count within the phase, shown beside the bar (or on the next log line)."""
        if self.bar is not None:
            now = time.perf_counter()
            redraw = now - self._last_line >= REDRAW_S
            if redraw:
                self._last_line = now
            self.bar.set_postfix_str(text, refresh=redraw)
        else:
            self._line(force=False, detail=text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def _line(self, *, force: bool, detail: str = "") -> None:
        now = time.perf_counter()
        if not force and now - self._last_line < LOG_INTERVAL_S:
            return
        self._last_line = now
        desc = f"{self.name}: {self.what}" if self.what else self.name
        text = tqdm.format_meter(self.done, self.total, now - self.started, unit=self.unit,
                                 prefix=desc, bar_format=LINE_FORMAT if self.total is not None
                                 else OPEN_LINE_FORMAT)
        print(text + (f"; {detail}" if detail else ""), file=self.stream, flush=True)


_open: Display | None = None


@contextmanager
def display(examples: int | None, passes: int = 1, *, enabled: bool,
            name: str = "attnaudit", unit: str = "examples",
            stream: TextIO | None = None) -> Iterator[None]:
    """The job's display for ``examples`` x ``passes`` units (None: not known, no time
    left is estimated) while the block runs; nothing when not ``enabled``; the open
    display when one is open already."""
    global _open
    if _open is not None or not enabled:
        yield
        return
    total = None if examples is None else examples * passes
    _open = Display(total, unit, name, stream or sys.stderr)
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
