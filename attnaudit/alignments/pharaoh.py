"""Word alignments in the Pharaoh format, with sure and possible links (talp style).

One line per sentence pair, links separated by spaces: ``i-j`` links source word ``i`` to
target word ``j`` (both 0-based) as a *sure* link; ``i-pj`` (also read: ``i?j``) marks a
*possible* link. Every sure link is possible as well (P ⊇ S, as Och & Ney define them), so
:attr:`Alignment.possible` holds both kinds. A predicted alignment has sure links only.
An empty line is a sentence with no link.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from attnaudit.errors import AlignmentError

Link = tuple[int, int]  # (source word, target word)

_LINK = re.compile(r"^(\d+)(-p|-|\?)(\d+)$")


@dataclass(frozen=True)
class Alignment:
    """One sentence pair's links: ``sure`` and ``possible`` sets of (source, target) word
    indices, ``possible`` holding every sure link too."""

    sure: frozenset[Link] = frozenset()
    possible: frozenset[Link] = field(default=frozenset())

    def __post_init__(self) -> None:
        object.__setattr__(self, "possible", frozenset(self.possible) | frozenset(self.sure))

    @classmethod
    def of(cls, sure: Iterable[Link], possible: Iterable[Link] = ()) -> Alignment:
        """An alignment from iterables of (source, target) pairs."""
        return cls(frozenset((int(i), int(j)) for i, j in sure),
                   frozenset((int(i), int(j)) for i, j in possible))

    def __repr__(self) -> str:
        return f"Alignment({self.to_line()!r})"

    def to_line(self) -> str:
        """The Pharaoh line: links ordered by source then target word, possible-only links
        written ``i-pj``."""
        return " ".join(f"{i}-{j}" if (i, j) in self.sure else f"{i}-p{j}"
                        for i, j in sorted(self.possible))


def parse_line(line: str, where: str = "line") -> Alignment:
    """An :class:`Alignment` from one Pharaoh line; AlignmentError naming ``where`` and the
    token that is not ``i-j``, ``i-pj`` or ``i?j``."""
    sure: set[tuple[int, int]] = set()
    possible: set[tuple[int, int]] = set()
    for token in line.split():
        match = _LINK.match(token)
        if match is None:
            raise AlignmentError(f"{where}: {token!r} is not a link; write i-j (sure) or i-pj "
                                 "(possible), 0-based source word i and target word j")
        link = (int(match.group(1)), int(match.group(3)))
        (sure if match.group(2) == "-" else possible).add(link)
    return Alignment(frozenset(sure), frozenset(possible))


def read_alignments(path: str | Path) -> list[Alignment]:
    """Every line of a Pharaoh file as an :class:`Alignment` (a final newline ends the last
    line; it adds no sentence)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AlignmentError(f"cannot read alignments from {path}: {exc}") from None
    return [parse_line(line, f"{path}, line {n}")
            for n, line in enumerate(text.splitlines(), start=1)]


def write_alignments(path: str | Path, alignments: Sequence[Alignment]) -> Path:
    """Write one Pharaoh line per alignment to ``path``; return the path."""
    out = Path(path)
    try:
        out.write_text("".join(a.to_line() + "\n" for a in alignments), encoding="utf-8")
    except OSError as exc:
        raise AlignmentError(f"cannot write alignments to {out}: {exc.strerror or exc}") from None
    return out
