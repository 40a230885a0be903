"""Bad flags of the settings the options object, the gold file and the plan add: each exits
with the usage code (2) and one line on stderr naming the flag or file, no traceback, and
--dry-run refuses what the audit it plans would refuse."""

from __future__ import annotations

import pytest

from attnaudit.cli import main
from attnaudit.cli.exits import USAGE_ERROR

TOY = "tests.helpers.toys.masking:correct"


def _one_line_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exited:  # argparse's usage errors
        code = main(argv)
        raise SystemExit(code)
    assert exited.value.code == USAGE_ERROR
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize(("argv", "message"), [
    (["report", TOY, "--dry-run", "--gold", "/nonexistent/gold.txt"],
     "attnaudit report: error: cannot read alignments from /nonexistent/gold.txt"),
    (["report", TOY, "--dry-run", "--explorer-examples", "0"],
     "argument --explorer-examples: must be at least 1, got 0"),
    (["report", TOY, "--dry-run", "--max-memory", "lots"],
     "--max-memory: memory must look like 2GiB"),
    (["report", TOY, "--dry-run", "--site", "nope"], "site 'nope' was not seen"),
    (["intervene", TOY, "--dry-run", "--head", "7"], r"heads [7] are not distinct head"),
    (["intervene", TOY, "--dry-run", "--methods", ""], "argument --methods: give distinct"),
    (["check", TOY, "--dry-run", "--row-sum-tolerance", "inf"],
     "--row-sum-tolerance must be a finite number >= 0, got inf"),
    (["check", TOY, "--dry-run", "--json"],
     "--json prints a check's result and --dry-run runs no check: give one of them"),
    (["report", TOY, "--dry-run", "--batch-size", "4"], "--batch-size goes with --hf DIR"),
])
def test_a_bad_flag_is_one_line_and_the_usage_code(capsys, argv, message):
    assert message in _one_line_error(capsys, ["--quiet", *argv])


def test_the_plan_of_a_good_gold_file_runs(capsys, tmp_path):
    gold = tmp_path / "gold.txt"
    gold.write_text("0-0\n" * 5, encoding="utf-8")  # one line per example of the toy's 5
    assert main(["--quiet", "report", TOY, "--dry-run", "--gold", str(gold)]) == 0
    assert capsys.readouterr().out.startswith("plan of audit toy_correct: 5 examples")
