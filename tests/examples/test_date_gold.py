"""The date task's gold alignments: the documented rule on hand-checked sources, and the
committed audit.gold file is the rule applied to the audit data."""

from __future__ import annotations

import pytest

from attnaudit.alignments.aer import count_links
from attnaudit.alignments.pharaoh import Alignment, parse_line, read_alignments
from attnaudit_examples.date import gold


@pytest.mark.parametrize(("source", "output", "line"), [
    # month name: possible links to both month characters; "3" is the day's second
    # character (sure) and stands for its added "0" (possible); the year digit by digit
    ("march 3, 1987", "1987-03-03",
     "0-p5 0-p6 1-p5 1-p6 2-p5 2-p6 3-p5 3-p6 4-p5 4-p6 6-p8 6-9 9-0 10-1 11-2 12-3"),
    ("20 april 1962", "1962-04-20",
     "0-8 1-9 3-p5 3-p6 4-p5 4-p6 5-p5 5-p6 6-p5 6-p6 7-p5 7-p6 9-0 10-1 11-2 12-3"),
    ("05/17/1971", "1971-05-17", "0-5 1-6 3-8 4-9 6-0 7-1 8-2 9-3"),  # US: 17 is the day
    ("17/05/1971", "1971-05-17", "0-8 1-9 3-5 4-6 6-0 7-1 8-2 9-3"),  # EU
    ("03/04/1971", "1971-03-04",  # ambiguous: both readings, possible
     "0-p5 0-p8 1-p6 1-p9 3-p5 3-p8 4-p6 4-p9 6-0 7-1 8-2 9-3"),
    ("may 17, 1971", "1971-5-17", ""),  # not YYYY-MM-DD: no link
])
def test_gold_rule_on_hand_checked_sources(source, output, line):
    assert gold.gold_alignment(source, output) == parse_line(line)


def test_committed_file_is_the_rule_on_the_audit_data():
    assert read_alignments(gold.AUDIT_GOLD) == gold.audit_gold()


def test_oracle_is_the_best_one_link_per_character_aligner():
    found = parse_line("0-p5 0-p6 1-p5 1-p6 6-p8 6-9 9-0 10-1 11-2 12-3")
    best = gold.oracle(found, 10)
    assert best == Alignment.of([(9, 0), (10, 1), (11, 2), (12, 3), (0, 4), (0, 5), (0, 6),
                                 (0, 7), (6, 8), (6, 9)])
    counts = count_links([best], [found])
    # |A| = 10, |S| = 5, A & S = 5 (year, 6-9), A & P = 8 (+ 0-5, 0-6, 6-8); 0-4, 0-7 miss
    assert counts.aer == pytest.approx(1 - (5 + 8) / (10 + 5))
