"""``attnaudit report --explorer-examples N``: parsed, checked, and recorded in the command
line that reproduces the report."""

from __future__ import annotations

import pytest

from attnaudit.cli.app import build_parser
from attnaudit.cli.commands import report_command_line
from attnaudit.report.explorer import DEFAULT_EXAMPLES


def test_the_explorer_examples_option():
    parser = build_parser()
    default = parser.parse_args(["report", "--out", "out"])
    assert default.explorer_examples == DEFAULT_EXAMPLES
    assert "--explorer-examples" not in report_command_line(default)
    given = parser.parse_args(["report", "--out", "out", "--explorer-examples", "2"])
    assert given.explorer_examples == 2
    line = report_command_line(given)
    assert line[line.index("--explorer-examples") + 1] == "2"
    for bad in ("0", "-1", "two"):
        with pytest.raises(SystemExit) as raised:
            parser.parse_args(["report", "--out", "out", "--explorer-examples", bad])
        assert raised.value.code == 2
