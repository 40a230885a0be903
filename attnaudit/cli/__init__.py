"""The ``attnaudit`` command: argument parsing, loading targets, printing.

The only part of attnaudit that parses arguments or prints for the command line; the work
lives in the library (:func:`attnaudit.audit` and the views of its result).
``parser`` builds the parser (torch-free: ``--help``, ``--version`` and usage errors answer
without importing the library), ``app`` runs a command, ``commands`` and ``align`` hold the
subcommands, ``settings`` turns arguments into :class:`attnaudit.options.AuditOptions`,
``loading`` into a target, ``display`` prints the intervention suite.
This module itself imports no more than the standard library until a command runs, so that
an install without the extras the commands need is told which to add (:mod:`.extras`).
"""

from __future__ import annotations

import sys

from attnaudit.cli.exits import USAGE_ERROR
from attnaudit.cli.extras import missing_extra
from attnaudit.cli.parser import parse
from attnaudit.cli.signals import interrupted, sigterm_as_interrupt


def main(argv: list[str] | None = None) -> int:
    """Run one command. A user error prints one line, ``attnaudit CMD: error: ...``, and
    exits 2; an unexpected exception, a bug in attnaudit, prints ``attnaudit CMD: this is
    a bug in attnaudit: ...`` and exits 4 (``--debug``: the traceback too, for either);
    Ctrl-C and SIGTERM print one line and exit 130, after every output folder has been
    cleaned up. Under ``torchrun`` the command runs on every rank
    (:mod:`attnaudit.runtime.distributed`): rank 0 prints and writes, every rank prints its
    error and exits with the same status. Without the packages of ``attnaudit[all]`` it
    prints one line naming that extra and exits 2.

    A process that ``torchrun`` started for the command line (``argv`` None) leaves with
    :func:`os._exit` once its process group is destroyed and its output flushed: gloo's
    threads can otherwise abort it (exit -6) while the interpreter tears its objects down,
    after the audit is complete."""
    args = parse(argv)  # --help, --version, usage errors: no torch
    try:
        with sigterm_as_interrupt():  # from before the seconds the libraries take to import
            try:
                from attnaudit.cli.app import run
            except ModuleNotFoundError as exc:
                message = missing_extra(exc, "the attnaudit command")
                if message is None:
                    raise
                print(f"attnaudit: error: {message}", file=sys.stderr)
                return USAGE_ERROR
            except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM while importing
                return interrupted(args.command, exc)
            try:
                return run(args, from_command_line=argv is None)
            except KeyboardInterrupt as exc:  # one arriving while an error is printed
                return interrupted(args.command, exc)
    except KeyboardInterrupt as exc:  # one arriving as the handler is being installed
        return interrupted(args.command, exc)
