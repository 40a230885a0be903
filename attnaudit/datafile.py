"""Audit data files: ``source[<TAB>target]`` lines, read strictly.

Every problem is reported with the file and the line it is on, and what to do about it:
a missing file or a folder, an empty file, binary content (a NUL byte), bytes that are not
UTF-8, a line with more than two tab-separated columns or an empty source, and a file in
which some lines give a target and others do not. Blank lines are skipped; line numbers
count every line of the file, from 1.
"""

from __future__ import annotations

from pathlib import Path

from attnaudit.errors import AttnauditError


class DataFileError(AttnauditError):
    """A data file cannot be read as ``source[<TAB>target]`` lines."""


def read_pairs(path: str | Path) -> tuple[list[str], list[str] | None]:
    """The sources of ``path`` and their targets (None when no line gives one).

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
    sources: list[str] = []
    targets: list[str | None] = []
    first_with, first_without = None, None
    for number, line in enumerate(lines, start=1):
        text = _decode(path, number, line.removesuffix(b"\r"))
        if not text.strip():
            continue
        cells = text.split("\t")
        if len(cells) > 2:
            raise DataFileError(f"{path}, line {number}: {len(cells)} tab-separated columns; "
                                "expected source or source<TAB>target (a tab inside a "
                                "sentence must be replaced by a space)")
        if not cells[0].strip():
            raise DataFileError(f"{path}, line {number}: the source (first column) is empty")
        sources.append(cells[0])
        targets.append(cells[1] if len(cells) == 2 else None)
        if len(cells) == 2:
            first_with = first_with or number
        else:
            first_without = first_without or number
    if not sources:
        raise DataFileError(f"data file {path} is empty: expected source[<TAB>target] lines, "
                            "one example per line")
    if first_with and first_without:
        raise DataFileError(f"{path}: line {first_with} gives a target (source<TAB>target) "
                            f"but line {first_without} does not; give targets on every line "
                            "or on none")
    return sources, None if first_without else [t or "" for t in targets]


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
