"""Running one parsed command: under signals and torchrun, with its errors sorted by whose
fault they are.

Imported by :func:`attnaudit.cli.main` once the arguments parse; it brings in every library
the commands use (torch, captum, seaborn, ...).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
import warnings
from collections.abc import Callable
from typing import TextIO

import torch

from attnaudit.cli.align import align_command
from attnaudit.cli.commands import check_command, demo_command, intervene_command, report_command
from attnaudit.cli.exits import INTERNAL_ERROR, USAGE_ERROR
from attnaudit.cli.extras import missing_extra
from attnaudit.cli.parser import build_parser as build_parser  # attnaudit.cli.app.build_parser
from attnaudit.cli.signals import interrupted
from attnaudit.errors import AttnauditError
from attnaudit.runtime.distributed import launched_by_torchrun, main_rank_output, torchrun_session

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "demo": demo_command, "check": check_command, "intervene": intervene_command,
    "align": align_command, "report": report_command}


def run(args: argparse.Namespace, *, from_command_line: bool) -> int:
    """:func:`attnaudit.cli.main` once the arguments parse and the command's libraries
    import (SIGTERM already raises :class:`~attnaudit.errors.Terminated`, see
    :mod:`attnaudit.cli.signals`); ``from_command_line``: the process is the ``attnaudit``
    command itself."""
    status = _run_command(args)
    if from_command_line and launched_by_torchrun():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


def _run_command(args: argparse.Namespace) -> int:
    debug = getattr(args, "debug", False)
    try:
        with warnings.catch_warnings(), torchrun_session() as shard, main_rank_output(shard):
            warnings.showwarning = _warning_line(args.command)
            return COMMANDS[args.command](args)
    except KeyboardInterrupt as exc:
        return interrupted(args.command, exc)
    except Exception as exc:
        if debug:
            traceback.print_exc()
        line, status = _one_line(exc, f"attnaudit {args.command}", debug)
        print(f"attnaudit {args.command}: {line}", file=sys.stderr)
        return status


def _warning_line(command: str) -> Callable[..., None]:
    """A ``warnings.showwarning`` that prints ``attnaudit CMD: warning: message`` as one
    line on stderr: the user acts on the message, not on the source line that raised it."""

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: TextIO | None = None, line: str | None = None) -> None:
        text = " ".join(str(message).split()).removeprefix("attnaudit: ")
        print(f"attnaudit {command}: warning: {text}", file=file or sys.stderr)

    return show


def _one_line(exc: Exception, command: str, debug: bool) -> tuple[str, int]:
    """The error's line and the exit status. The user can act on an error attnaudit raised
    on purpose, a missing extra and exhausted memory (exit 2); anything else is a bug in
    attnaudit, said as such, with how to see more (exit 4)."""
    message = " ".join(str(exc).split())
    if isinstance(exc, AttnauditError):
        return f"error: {message}", USAGE_ERROR
    extra = missing_extra(exc, command)
    if extra is not None:
        return f"error: {extra}", USAGE_ERROR
    what = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    if isinstance(exc, (MemoryError, torch.cuda.OutOfMemoryError)):
        return (f"error: out of memory ({what}); give a smaller --max-memory, --batch-size "
                "or --limit"), USAGE_ERROR
    more = "the traceback is above" if debug else "run again with --debug for the traceback"
    return f"this is a bug in attnaudit: {what} ({more})", INTERNAL_ERROR
