"""Every command's ``--help`` says what the command does, names each option's value
(never a raw ``SOME_DEST`` metavar) and points only to documentation that exists and covers
the option."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from attnaudit.cli.parser import build_parser

ROOT = Path(__file__).resolve().parents[2]


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


@pytest.mark.parametrize("name", ["demo", "check", "intervene", "align", "report"])
def test_each_command_has_a_description_and_named_values(name):
    command = _commands()[name]
    assert command.description and len(command.description.split()) >= 6
    text = command.format_help()
    assert command.description.split()[0] in text
    for action in command._actions:
        for flag in action.option_strings:
            raw = flag.lstrip("-").upper().replace("-", "_")
            if "_" in raw:  # argparse's default metavar for a multi-word option
                assert not re.search(rf"{flag} {raw}\b", text), (name, flag)
    assert "README" not in text


def test_the_row_sum_tolerance_help_points_to_a_page_that_covers_it():
    help_text = _commands()["check"].format_help()
    assert "docs/gate.md" in " ".join(help_text.split())
    page = (ROOT / "docs" / "gate.md").read_text(encoding="utf-8")
    tolerances = page[page.index("## Tolerances"):]
    assert "--row-sum-tolerance" in tolerances and "row-sum tolerance follows" in tolerances
