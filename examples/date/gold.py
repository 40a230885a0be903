"""Gold alignments of the date task, derived from the source text and the ISO output alone.

Units are characters on both sides (the date models' tokens): source character i, output
character j, as ``attnaudit align --units tokens`` numbers them. The rule, per field:

- **year**: source year digit k (the last four characters) - output character k, sure;
- **numeric day or month** (``mm/dd/yyyy``, ``dd/mm/yyyy``): digit k of the field - the
  field's output character k, sure; the field that exceeds 12 is the day (a source whose
  first two fields could both be months gets both readings as possible links);
- **day written without its leading zero** (``march 3, 1987``): the digit - the second
  output character of the day, sure, and - the first (the added ``0``), possible;
- **month name**: every character of the name - each of the two output month characters,
  possible (no character of ``march`` is the ``0`` or the ``3`` of ``03``).

The hyphens, spaces, commas and slashes have no link, so an aligner that links every output
character (as an argmax does) cannot reach AER 0: :func:`oracle` is the best such aligner.
An output that is not ``YYYY-MM-DD`` gets no link.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from attnaudit.alignments.pharaoh import Alignment, Link, write_alignments
from attnaudit.targets.contract import Batch

from .data import MONTHS, make_splits

ISO = re.compile(r"^\d{4}-\d{2}-\d{2}$")
YEAR, MONTH, DAY = 0, 5, 8  # where each field starts in the output
AUDIT_GOLD = Path(__file__).with_name("audit.gold")
_NAMED = re.compile(r"^(?:(?P<m1>[a-z]+) (?P<d1>\d{1,2}), |(?P<d2>\d{1,2}) (?P<m2>[a-z]+) )"
                    r"(?P<y>\d{4})$")
_NUMERIC = re.compile(r"^(?P<a>\d{2})/(?P<b>\d{2})/(?P<y>\d{4})$")


def _digits(start: int, text: str, field: int) -> tuple[list[Link], list[Link]]:
    """Sure and possible links of a number's digits at ``start`` to an output field."""
    if len(text) == 2:
        return [(start, field), (start + 1, field + 1)], []
    return [(start, field + 1)], [(start, field)]


def gold_alignment(source: str, output: str) -> Alignment:
    """The gold alignment of ``source`` (character units) to the ISO ``output``."""
    if not ISO.match(output):
        return Alignment()
    year = len(source) - 4
    sure: list[Link] = [(year + k, YEAR + k) for k in range(4)]
    possible: list[Link] = []
    named, numeric = _NAMED.match(source), _NUMERIC.match(source)
    if named is not None:
        month, day = ("m1", "d1") if named.group("m1") else ("m2", "d2")
        if named.group(month) not in MONTHS:
            return Alignment()
        possible += [(i, MONTH + k) for i in range(*named.span(month)) for k in range(2)]
        s, p = _digits(named.start(day), named.group(day), DAY)
        sure, possible = sure + s, possible + p
    elif numeric is not None:
        a, b = int(numeric.group("a")), int(numeric.group("b"))
        readings = [(MONTH, DAY)] if a <= 12 < b else [(DAY, MONTH)] if b <= 12 < a else \
            [(MONTH, DAY), (DAY, MONTH)] if a <= 12 and b <= 12 else []
        for first, second in readings:
            links = [(0, first), (1, first + 1), (3, second), (4, second + 1)]
            (sure if len(readings) == 1 else possible).extend(links)
    else:
        return Alignment()
    return Alignment.of(sure, possible)


def oracle(gold: Alignment, n_output: int) -> Alignment:
    """The best aligner that links every one of ``n_output`` output characters to one source
    character: a sure gold link where the character has one, else a possible one, else any
    (here: source character 0)."""
    links = []
    for j in range(n_output):
        choices = sorted(i for i, jj in gold.sure if jj == j) or \
            sorted(i for i, jj in gold.possible if jj == j) or [0]
        links.append((choices[0], j))
    return Alignment.of(links)


def gold_lines(target_tokens: Callable[[torch.Tensor], list[list[str]]], eos_id: int
               ) -> Callable[[Batch, torch.Tensor], list[str]]:
    """A target's ``gold_alignments``: each source's gold alignment to its emitted output
    (the output characters before the end of sequence), as Pharaoh lines."""

    def lines(batch: Batch, emitted: torch.Tensor) -> list[str]:
        out = []
        for text, ids, tokens in zip(batch.texts, emitted.tolist(), target_tokens(emitted),
                                     strict=True):
            end = ids.index(eos_id) if eos_id in ids else len(ids)
            out.append(gold_alignment(text, "".join(map(str, tokens[:end]))).to_line())
        return out

    return lines


def audit_gold(limit: int | None = None) -> list[Alignment]:
    """Gold alignments of the bundled models' audit data (its ISO references as outputs;
    default: all audit sources)."""
    from .target import AUDIT_SOURCES

    pairs = make_splits().unambiguous("valid", AUDIT_SOURCES if limit is None else limit)
    return [gold_alignment(s, t) for s, t in pairs]


def write_audit_gold(path: str | Path = AUDIT_GOLD,
                     alignments: Sequence[Alignment] | None = None) -> Path:
    """Write the audit data's gold alignments (Pharaoh, ``i-j`` sure, ``i-pj`` possible)."""
    return write_alignments(path, audit_gold() if alignments is None else alignments)


if __name__ == "__main__":
    print(write_audit_gold(*sys.argv[1:2]))
