"""Blank lines of a data file are skipped and counted: the rows say which lines they were,
and the run says so ("FILE: 2 examples, 1 blank line skipped (line 2)"), from Python and on
the command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnaudit.targets.data import audit_data
from attnaudit.targets.datafile import read_rows

ROOT = Path(__file__).resolve().parents[2]
HF_MODEL = ROOT / "examples" / "date_transformer" / "model"


@pytest.mark.parametrize(("text", "sources", "blank"), [
    ("a\n\nb\n", ["a", "b"], (2,)),
    ("a\n \t\nb\n\n", ["a", "b"], (2, 4)),  # whitespace only; a blank line at the end
    ("a\r\n\r\nb", ["a", "b"], (2,)),  # CRLF, no final newline
    ("a\nb\n", ["a", "b"], ()),  # the end after the final newline is no line
])
def test_blank_lines_are_numbered(tmp_path, text, sources, blank):
    path = tmp_path / "data.tsv"
    path.write_bytes(text.encode())
    rows = read_rows(path)
    assert rows.sources == sources and rows.blank_lines == blank


def test_loading_the_data_counts_the_skipped_lines(tmp_path):
    path = tmp_path / "data.tsv"
    path.write_text("March 3, 2001\n\n3/4/99\n")
    with pytest.warns(UserWarning) as caught:
        data = audit_data(str(path), None)
    assert data.sources == ["March 3, 2001", "3/4/99"]
    assert [str(w.message) for w in caught] == [
        f"attnaudit: {path}: 2 examples, 1 blank line skipped (line 2)"]
    many = tmp_path / "many.tsv"
    many.write_text("a\n" + "\n" * 7 + "b\n")
    assert read_rows(many).skipped_note(many) == (
        f"{many}: 2 examples, 7 blank lines skipped (lines 2, 3, 4, 5, 6, ...)")


def test_the_command_line_says_how_many_lines_were_skipped(tmp_path):
    pytest.importorskip("transformers")
    data = tmp_path / "dev.tsv"
    data.write_text("March 3, 2001\n\n3/4/99\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    result = subprocess.run([sys.executable, "-m", "attnaudit", "check", "--hf", str(HF_MODEL),
                             "--data", str(data), "--quiet"], cwd=ROOT, capture_output=True,
                            text=True, check=False, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    assert (f"attnaudit check: warning: {data}: 2 examples, 1 blank line skipped (line 2)"
            in result.stderr.splitlines())
    assert "2 examples" in result.stdout
