"""Parsed flags as :class:`attnaudit.options.AuditOptions`: each flag's attribute is read by
its setting's name (:func:`attnaudit.options.setting_names`), so a flag and its field cannot
drift apart without this module failing (tests/cli/test_options_match_flags.py)."""

from __future__ import annotations

import argparse
import re
from dataclasses import fields

from attnaudit.cli.loading import memory_option
from attnaudit.errors import OptionError
from attnaudit.options import AuditMode, AuditOptions, Loading, flag_of, setting_names

# What load_cli_target has used already: the target it returns is placed and batched.
LOADED = ("device", "dtype", *(f.name for f in fields(Loading)))


def audit_options(args: argparse.Namespace, mode: AuditMode | None = None) -> AuditOptions:
    """The command's settings (``mode`` default: ``--quick`` or full) for the target
    :func:`attnaudit.cli.loading.load_cli_target` returns: the settings it has used
    (:data:`LOADED`: the device, the dtype and :class:`~attnaudit.options.Loading`'s) are
    left out. ``--max-memory`` is in bytes. A bad value is an OptionError that names its
    flag."""
    given = {name: getattr(args, name) for name in setting_names()
             if name not in LOADED and hasattr(args, name)}
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
