"""SIGTERM handled as Ctrl-C is, from the moment the command's arguments parse.

Torch-free: :func:`attnaudit.cli.main` installs the handler before it imports the libraries
the commands use, which takes seconds; a SIGTERM in that time would otherwise end the
process by the default action (exit 143, no message), whether or not it was launched with
job control.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator

from attnaudit.cli.exits import INTERRUPTED
from attnaudit.errors import Terminated


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises :class:`~attnaudit.errors.Terminated` (a KeyboardInterrupt) inside the
    block, so every ``finally`` and output folder cleans up; the previous handler comes back
    after it. Outside the main thread (where handlers cannot be set) the block simply runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def interrupted(command: str, exc: KeyboardInterrupt) -> int:
    """Print the one line for Ctrl-C or SIGTERM on stderr; return the exit status (130)."""
    what = "terminated" if isinstance(exc, Terminated) else "interrupted"
    print(f"attnaudit {command}: {what}; an output folder is replaced only by a complete run",
          file=sys.stderr)
    return INTERRUPTED
