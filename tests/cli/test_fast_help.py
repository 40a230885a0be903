"""``--help``, ``COMMAND --help``, ``--version`` and usage errors answer without importing
torch: the parser is torch-free (attnaudit.cli.parser) and ``import attnaudit`` imports
nothing until a name is used."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# Each argv, run in one fresh interpreter: its exit status, and whether torch was imported.
RUNNER = """
import json, sys
from attnaudit.cli import main
found = []
for argv in json.loads(sys.argv[1]):
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    found.append([argv, code, "torch" in sys.modules])
print(json.dumps(found))
"""

ANSWERED = [
    (["--help"], 0), (["--version"], 0), (["nosuchcommand"], 2), (["--bogus"], 2),
    *[([command, "--help"], 0) for command in ("demo", "check", "intervene", "align", "report")],
    (["report"], 2),  # --out is required (unless --dry-run)
    (["check", "--limit", "0"], 2), (["report", "--out", "o", "--head", "x"], 2),
    (["align", "--layer", "top"], 2), (["intervene", "--methods", "nosuch"], 2),
]


def _run(argvs: list[list[str]]) -> list[list]:
    result = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(argvs)],
                            capture_output=True, text=True, check=False, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_help_version_and_usage_errors_do_not_import_torch():
    found = _run([argv for argv, _ in ANSWERED])
    assert [(argv, code) for argv, code, _ in found] == ANSWERED
    assert [argv for argv, _, torch in found if torch] == []


@pytest.mark.parametrize("argv", [["--help"], ["report", "--help"], ["nosuchcommand"]])
def test_the_console_script_path_stays_torch_free(argv):
    """``python -X importtime`` of the command as installed (``python -m attnaudit``): no
    torch module among what it imported."""
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "attnaudit", *argv],
                            capture_output=True, text=True, check=False, timeout=300)
    assert result.returncode == (2 if argv == ["nosuchcommand"] else 0), result.stderr
    imported = [line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()
                if line.startswith("import time:")]
    assert "attnaudit.cli.parser" in imported
    assert not [m for m in imported if m == "torch" or m.startswith("torch.")]


def test_a_command_that_runs_does_import_the_library():
    """The runner can see torch: a command that does work imports it (``demo`` is not run;
    the check is on the import of what runs commands)."""
    code = RUNNER.replace("found = []", "import attnaudit.cli.app\nfound = []")
    result = subprocess.run([sys.executable, "-c", code, json.dumps([["--version"]])],
                            capture_output=True, text=True, check=False, timeout=300)
    assert json.loads(result.stdout.splitlines()[-1]) == [[["--version"], 0, True]]
