"""scripts/mutation_check.py's table names lines that are there: every planted bug's file
holds its line exactly once and its tests exist, and a line that moved is reported with the
file it moved to."""

from __future__ import annotations

from pathlib import Path

from scripts.mutation_check import MUTATIONS, Mutation, table_problems


def test_every_mutation_finds_its_line_once_and_its_tests():
    assert table_problems(MUTATIONS) == []


def test_a_moved_line_and_a_missing_test_are_named(tmp_path: Path):
    (tmp_path / "attnaudit" / "old").mkdir(parents=True)
    (tmp_path / "attnaudit" / "old" / "place.py").write_text("x = 1\n")
    (tmp_path / "attnaudit" / "new.py").write_text("y = 2\nz = 0.5 * y\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_here.py").write_text("")
    moved = Mutation("half", "no half", "attnaudit/old/place.py", "z = 0.5 * y", "z = y",
                     ("tests/test_here.py::test_it",))
    gone = Mutation("gone", "file gone", "attnaudit/gone.py", "y = 2", "y = 3",
                    ("tests/test_missing.py",))
    assert table_problems([moved, gone], tmp_path) == [
        "half: attnaudit/old/place.py: line found 0 times ('z = 0.5 * y'); the line is now "
        "in attnaudit/new.py",
        "gone: attnaudit/gone.py: file not found ('y = 2'); the line is now in "
        "attnaudit/new.py",
        "gone: test file not found: tests/test_missing.py"]
