"""Parsed flags as :class:`attnaudit.options.AuditOptions`: each flag's attribute is read by
its setting's name (:func:`attnaudit.options.setting_names`), so a flag and its field cannot
drift apart without this module failing (tests/cli/test_options_match_flags.py)."""

from __future__ import annotations

import argparse
import re

from attnaudit.cli.loading import memory_option
from attnaudit.errors import OptionError
from attnaudit.options import AuditMode, AuditOptions, flag_of, setting_names


def audit_options(args: argparse.Namespace, mode: AuditMode | None = None) -> AuditOptions:
    """The command's settings (``mode`` default: ``--quick`` or full). device and dtype are
    left out: :func:`attnaudit.cli.loading.load_cli_target` has placed the target on them;
    ``--max-memory`` is in bytes. A bad value is an OptionError that names its flag."""
    given = {name: getattr(args, name) for name in setting_names()
             if name not in ("device", "dtype") and hasattr(args, name)}
    given["max_memory"] = memory_option(args)
    if mode is None:
        mode = AuditMode.QUICK if getattr(args, "quick", False) else AuditMode.FULL
    try:
        return AuditOptions.from_settings(given, AuditOptions(mode=mode))
    except OptionError as exc:
        raise OptionError(_flagged(str(exc))) from None


def _flagged(message: str) -> str:
    """``limit must ...`` -> ``--limit must ...``: the user typed the flag."""
    name = re.match(r"\w+", message)
    if name is None or name.group() not in setting_names():
        return message
    return flag_of(name.group()) + message[name.end():]
