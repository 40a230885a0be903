"""Whose fault an error is: an unexpected exception is a bug in attnaudit (exit 4, one line
saying so; ``--debug`` adds the traceback), never the user's exit 2."""

from __future__ import annotations

import argparse

import pytest

import attnaudit.cli.app
from attnaudit.cli import main
from attnaudit.cli.exits import INTERNAL_ERROR, USAGE_ERROR
from attnaudit.errors import TargetError


def _planting(error: BaseException):
    def command(args: argparse.Namespace) -> int:
        raise error
    return command


@pytest.fixture
def plant(monkeypatch):
    def planted(error: BaseException) -> None:
        monkeypatch.setitem(attnaudit.cli.app.COMMANDS, "check", _planting(error))
    return planted


def test_an_unexpected_exception_is_a_bug_with_its_own_exit_code(plant, capsys):
    plant(RuntimeError("planted\n  over two lines"))
    assert main(["check"]) == INTERNAL_ERROR == 4
    err = capsys.readouterr().err
    assert err == ("attnaudit check: this is a bug in attnaudit: RuntimeError: planted over "
                   "two lines (run again with --debug for the traceback)\n")


def test_debug_shows_the_traceback_of_the_bug(plant, capsys):
    plant(RuntimeError("planted"))
    assert main(["check", "--debug"]) == INTERNAL_ERROR
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert "in command\n    raise error" in err
    assert err.splitlines()[-1] == ("attnaudit check: this is a bug in attnaudit: "
                                    "RuntimeError: planted (the traceback is above)")


@pytest.mark.parametrize(("error", "line"), [
    (TargetError("no such factory; give package.module:factory"),
     "attnaudit check: error: no such factory; give package.module:factory"),
    (ModuleNotFoundError("No module named 'captum'", name="captum"),
     "attnaudit check: error: attnaudit check needs captum, which is not installed: "
     "pip install 'attnaudit[all]'"),
    (MemoryError(), "attnaudit check: error: out of memory (MemoryError); give a smaller "
                    "--max-memory, --batch-size or --limit"),
])
def test_errors_the_user_can_act_on_stay_exit_2(plant, capsys, error, line):
    plant(error)
    assert main(["check"]) == USAGE_ERROR
    assert capsys.readouterr().err == line + "\n"
