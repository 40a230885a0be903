"""What every benchmark shares: its argument parser, side-by-side timing, a child process's
peak memory, and the machine's load beside the figures.

Benchmarks run from the checkout's root as ``python -m benchmarks.NAME``; a benchmark that
measures a fresh process starts it the same way (``python -m benchmarks.NAME --child ...``,
:func:`run_child`), so imports never depend on the script's own folder. The machine may be
shared: every benchmark prints the ``uptime`` load averages (:func:`load`) beside its figures,
and compares only what it measured side by side in one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KIB = 1024


def parser(module: str, doc: str | None) -> argparse.ArgumentParser:
    """The parser of ``python -m MODULE``, described by the first paragraph of its docstring
    (``module``: the benchmark's ``__spec__.name``, e.g. ``benchmarks.causal_lm``)."""
    return argparse.ArgumentParser(prog=f"python -m {module}",
                                   description=(doc or "").split("\n\n")[0])


def load() -> str:
    """``uptime``'s load averages over 1, 5 and 15 minutes, e.g. ``load 1.02 0.87 0.60``."""
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f}"


def banner() -> str:
    """torch's version and thread count beside the load: the first line a benchmark prints."""
    import torch

    return f"torch {torch.__version__}, {torch.get_num_threads()} threads, {load()}"


def seconds(run: Callable[[], object]) -> float:
    """Wall-clock seconds of one call of ``run``."""
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def alternating(first: Callable[[], float], second: Callable[[], float], rounds: int
                ) -> tuple[float, float]:
    """Medians of ``rounds`` timings of each (both return their own seconds), alternating
    which runs first so that drift on a shared machine hits both alike."""
    a, b = [], []
    for r in range(rounds):
        if r % 2:
            b.append(second())
            a.append(first())
        else:
            a.append(first())
            b.append(second())
    return statistics.median(a), statistics.median(b)


def best_of(run: Callable[[], object], repeats: int = 5) -> float:
    """The fastest of ``repeats`` timed calls (one untimed call first), in seconds."""
    run()
    return min(seconds(run) for _ in range(repeats))


@dataclass(frozen=True)
class ChildRun:
    """A finished child process: its output, wall time and own peak resident memory."""

    stdout: str
    stderr: str
    seconds: float
    peak_rss_kib: int  # the child's (and its waited-for children's) ru_maxrss

    @property
    def peak_rss_gib(self) -> float:
        return self.peak_rss_kib / KIB**2

    @property
    def peak_rss_mib(self) -> float:
        return self.peak_rss_kib / KIB


def run_child(argv: Sequence[str], env: dict[str, str] | None = None) -> ChildRun:
    """Run ``argv`` from the checkout's root and wait for it; exit with its command and the
    tail of its stderr when it fails. Peak RSS comes from ``os.wait4`` on this child alone
    (``RUSAGE_CHILDREN`` would be the largest of every child so far)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        process = subprocess.Popen(list(argv), cwd=ROOT, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(process.pid, 0)
        elapsed = time.perf_counter() - start
        process.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    if process.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed (exit {process.returncode}):\n{stderr[-3000:]}")
    return ChildRun(stdout, stderr, elapsed, usage.ru_maxrss)


def python_module(module: str, *args: str) -> list[str]:
    """``python -m MODULE ARGS`` with this interpreter."""
    return [sys.executable, "-m", module, *args]
