"""The metric definitions shipped with attnaudit (``attnaudit/docs/metrics.md``), as blocks
the report's appendix renders: headings, paragraphs and list items, each a run of text and
inline-code segments. A reader of a report (or of a copy sent elsewhere) has the definitions
it cites without the repository."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files

DEFINITIONS = files("attnaudit") / "docs" / "metrics.md"


@dataclass(frozen=True)
class Block:
    """kind: ``title``, ``heading``, ``paragraph`` or ``item``; parts: (is_code, text)."""

    kind: str
    parts: tuple[tuple[bool, str], ...]


def _parts(text: str) -> tuple[tuple[bool, str], ...]:
    pieces = text.replace("``", "`").split("`")
    return tuple((i % 2 == 1, piece) for i, piece in enumerate(pieces) if piece)


def definition_blocks(text: str | None = None) -> list[Block]:
    """The definitions page (or ``text``, in its Markdown subset) as blocks."""
    text = DEFINITIONS.read_text(encoding="utf-8") if text is None else text
    blocks: list[Block] = []
    kind = ""
    lines: list[str] = []

    def close() -> None:
        if lines:
            blocks.append(Block(kind, _parts(" ".join(lines))))
            lines.clear()

    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            close()
        elif line.startswith("#"):
            close()
            blocks.append(Block("title" if line.startswith("# ") else "heading",
                                _parts(line.lstrip("#").strip())))
        elif line.startswith("- "):
            close()
            kind = "item"
            lines.append(line[2:])
        else:
            if not lines:
                kind = "paragraph"
            lines.append(line)
    close()
    return blocks
