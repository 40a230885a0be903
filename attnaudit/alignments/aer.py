"""Alignment error rate, precision and recall (Och & Ney 2003), summed over a corpus.

With A the predicted links, S the sure and P the possible gold links (P ⊇ S), counted over
every sentence pair together (not averaged per sentence):

- precision = |A ∩ P| / |A|;
- recall = |A ∩ S| / |S|;
- AER = 1 - (|A ∩ S| + |A ∩ P|) / (|A| + |S|).

A gold set without sure links has no recall (None); an empty prediction has no precision
(None) and, with sure links in the gold, an AER of 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from attnaudit.alignments.pharaoh import Alignment
from attnaudit.errors import AlignmentError


@dataclass(frozen=True)
class AlignmentCounts:
    """Corpus link counts: ``predicted`` |A|, ``sure`` |S|, ``hit_sure`` |A ∩ S|,
    ``hit_possible`` |A ∩ P|, over ``sentences`` pairs."""

    predicted: int = 0
    sure: int = 0
    hit_sure: int = 0
    hit_possible: int = 0
    sentences: int = 0

    def __add__(self, other: AlignmentCounts) -> AlignmentCounts:
        return AlignmentCounts(*(a + b for a, b in zip(self.astuple(), other.astuple(),
                                                        strict=True)))

    def astuple(self) -> tuple[int, int, int, int, int]:
        return (self.predicted, self.sure, self.hit_sure, self.hit_possible, self.sentences)

    @property
    def precision(self) -> float | None:
        return self.hit_possible / self.predicted if self.predicted else None

    @property
    def recall(self) -> float | None:
        return self.hit_sure / self.sure if self.sure else None

    @property
    def aer(self) -> float | None:
        total = self.predicted + self.sure
        return 1.0 - (self.hit_sure + self.hit_possible) / total if total else None


def count_links(predicted: Sequence[Alignment], gold: Sequence[Alignment]) -> AlignmentCounts:
    """The corpus counts of ``predicted`` (sure links) against ``gold``, pair by pair."""
    if len(predicted) != len(gold):
        raise AlignmentError(f"{len(predicted)} predicted alignments but {len(gold)} gold "
                             "ones; give one gold line per sentence pair of the data")
    total = AlignmentCounts()
    for a, g in zip(predicted, gold, strict=True):
        links = a.sure
        total += AlignmentCounts(len(links), len(g.sure), len(links & g.sure),
                                 len(links & g.possible), 1)
    return total
