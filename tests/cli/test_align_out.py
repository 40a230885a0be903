"""``attnaudit align --out``: a folder, as every other command's ``--out``, takes
``alignments.txt``; a file path still names the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnaudit.cli import main
from attnaudit.cli.align import alignments_path
from attnaudit.cli.parser import ALIGNMENTS_FILE
from attnaudit.errors import AlignmentError


def test_a_folder_takes_the_alignments_file_and_a_file_path_is_the_file(tmp_path):
    folder, new, file = tmp_path / "existing", tmp_path / "new" / "sub", tmp_path / "a.align"
    folder.mkdir()
    argv = ["--quiet", "align", "--limit", "2", "--units", "tokens", "--out"]
    assert main([*argv, str(file)]) == 0
    assert main([*argv, str(folder)]) == 0
    assert main([*argv, f"{new}/"]) == 0
    lines = file.read_text().splitlines()
    assert len(lines) == 2 and all("-" in line for line in lines)
    assert (folder / ALIGNMENTS_FILE).read_bytes() == file.read_bytes()
    assert (new / ALIGNMENTS_FILE).read_bytes() == file.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.align", "existing", "new"]


def test_a_folder_that_cannot_be_made_is_an_alignment_error(tmp_path):
    blocker = tmp_path / "a file"
    blocker.write_text("x")
    assert alignments_path(str(tmp_path / "plain.align")) == tmp_path / "plain.align"
    with pytest.raises(AlignmentError, match="cannot create the folder"):
        alignments_path(f"{blocker}/under/")
    assert Path(blocker).read_text() == "x"
