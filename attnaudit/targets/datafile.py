"""Audit data files: ``source[<TAB>target[<TAB>contrast]]`` lines, read strictly.

The optional third column is a contrast output per source (contrastive attribution,
``--attribute contrast``). Every problem is reported with the file and the line it is on, and
what to do about it: a missing file or a folder, an empty file, binary content (a NUL byte),
bytes that are not UTF-8, a line with more than three tab-separated columns, an empty source
or contrast, and a file in which some lines give a target (or a contrast) and others do not.
Blank lines are skipped and counted (:attr:`DataRows.blank_lines`; loading the data warns
"FILE: 2 examples, 1 blank line skipped (line 2)"); line numbers count every line of the
file, from 1, and the empty end after a final newline is no line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from attnaudit.errors import DataFileError


@dataclass(frozen=True)
class DataRows:
    """A data file's columns: sources, targets and contrasts (None when no line gives
    them), one entry per non-blank line; ``blank_lines``: the numbers of the blank lines
    skipped."""

    sources: list[str]
    targets: list[str] | None
    contrasts: list[str] | None
    blank_lines: tuple[int, ...] = field(default=())

    def skipped_note(self, path: str | Path) -> str | None:
        """``"FILE: 2 examples, 1 blank line skipped (line 2)"``, or None when no line was
        blank."""
        if not self.blank_lines:
            return None
        count, shown = len(self.blank_lines), self.blank_lines[:5]
        lines = ", ".join(map(str, shown)) + (", ..." if count > len(shown) else "")
        return (f"{path}: {len(self.sources)} examples, {count} blank "
                f"line{'s' if count > 1 else ''} skipped (line{'s' if count > 1 else ''} "
                f"{lines})")


def read_rows(path: str | Path) -> DataRows:
    """The sources, targets and contrasts of ``path``.

    Raises:
        DataFileError: naming the file, the line and the fix (see the module docstring).
    """
    path = Path(path)
    if not path.exists():
        raise DataFileError(f"data file not found: {path}")
    if not path.is_file():
        raise DataFileError(f"data file {path} is not a file; give a TSV of "
                            "source[<TAB>target] lines")
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    if lines[-1] == b"":  # the end after a final newline
        lines.pop()
    columns: list[list[str]] = [[], [], []]
    blank: list[int] = []
    first_line: dict[int, int] = {}  # number of columns -> the first line that has that many
    for number, line in enumerate(lines, start=1):
        text = _decode(path, number, line.removesuffix(b"\r"))
        if not text.strip():
            blank.append(number)
            continue
        cells = text.split("\t")
        if len(cells) > 3:
            raise DataFileError(f"{path}, line {number}: {len(cells)} tab-separated columns; "
                                "expected source, source<TAB>target or "
                                "source<TAB>target<TAB>contrast (a tab inside a sentence must "
                                "be replaced by a space)")
        if not cells[0].strip():
            raise DataFileError(f"{path}, line {number}: the source (first column) is empty")
        if len(cells) == 3 and not cells[2].strip():
            raise DataFileError(f"{path}, line {number}: the contrast (third column) is empty")
        first_line.setdefault(len(cells), number)
        for column, cell in zip(columns, cells, strict=False):
            column.append(cell)
    if not columns[0]:
        raise DataFileError(f"data file {path} is empty: expected source[<TAB>target] lines, "
                            "one example per line")
    if len(first_line) > 1:
        (fewer, at), (_, other) = sorted(first_line.items())[:2]
        what = "a target (source<TAB>target)" if fewer == 1 else "a contrast (third column)"
        raise DataFileError(f"{path}: line {other} gives {what} but line {at} does not; give "
                            f"{'targets' if fewer == 1 else 'contrasts'} on every line or on "
                            "none")
    width = next(iter(first_line))
    return DataRows(columns[0], columns[1] if width > 1 else None,
                    columns[2] if width > 2 else None, tuple(blank))


def _decode(path: Path, number: int, line: bytes) -> str:
    nul = line.find(b"\x00")
    if nul >= 0:
        raise DataFileError(f"{path}, line {number}: binary data (a NUL byte at column "
                            f"{nul + 1}); expected UTF-8 text")
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataFileError(
            f"{path}, line {number}: not UTF-8 (byte 0x{line[exc.start]:02x} at column "
            f"{exc.start + 1}); convert the file to UTF-8, e.g. iconv -f latin1 -t utf-8"
        ) from None
