"""Pharaoh lines and files, and AER / precision / recall against hand counts."""

from __future__ import annotations

import pytest

from attnaudit.alignments.aer import AlignmentCounts, count_links
from attnaudit.alignments.pharaoh import (
    Alignment,
    parse_line,
    read_alignments,
    write_alignments,
)
from attnaudit.errors import AlignmentError

GOLD = "0-0 1-p1 1-2 2-p2\n0-1\n\n"
PREDICTED = "0-0 1-1 2-1\n\n3-0\n"


def test_parse_sure_and_possible_links_possible_holds_sure():
    gold = parse_line("0-0 1-p1 1-2 2?2")
    assert gold.sure == {(0, 0), (1, 2)}
    assert gold.possible == {(0, 0), (1, 1), (1, 2), (2, 2)}


def test_write_read_round_trip(tmp_path):
    alignments = [Alignment.of([(0, 0), (2, 1)], [(1, 1), (0, 0)]), Alignment(),
                  Alignment.of([(10, 3)])]
    path = write_alignments(tmp_path / "a.txt", alignments)
    assert path.read_text() == "0-0 1-p1 2-1\n\n10-3\n"
    assert read_alignments(path) == alignments
    text = tmp_path / "gold.txt"
    text.write_text(GOLD)
    assert write_alignments(tmp_path / "again.txt",
                            read_alignments(text)).read_text() == GOLD


@pytest.mark.parametrize("bad", ["0-x", "1--2", "a-b", "0-1-2", "-1-2"])
def test_a_bad_token_names_the_file_and_line(tmp_path, bad):
    path = tmp_path / "bad.txt"
    path.write_text(f"0-0\n0-1 {bad}\n")
    with pytest.raises(AlignmentError, match=r"bad.txt, line 2: .* is not a link"):
        read_alignments(path)


def test_aer_precision_recall_equal_a_hand_count(tmp_path):
    (tmp_path / "gold").write_text(GOLD)
    (tmp_path / "pred").write_text(PREDICTED)
    gold, predicted = read_alignments(tmp_path / "gold"), read_alignments(tmp_path / "pred")
    counts = count_links(predicted, gold)
    # sentence 1: A = {0-0, 1-1, 2-1}, S = {0-0, 1-2}, P = S + {1-1, 2-2}:
    #   |A & S| = 1 (0-0), |A & P| = 2 (0-0, 1-1); sentence 2: A empty, S = {0-1};
    #   sentence 3: A = {3-0}, no gold link.
    assert counts == AlignmentCounts(predicted=4, sure=3, hit_sure=1, hit_possible=2,
                                     sentences=3)
    assert counts.precision == pytest.approx(2 / 4)
    assert counts.recall == pytest.approx(1 / 3)
    assert counts.aer == pytest.approx(1 - (1 + 2) / (4 + 3))
    first = count_links(predicted[:1], gold[:1])
    assert first.aer == pytest.approx(1 - 3 / 5)


def test_perfect_and_empty_predictions():
    gold = [parse_line("0-0 1-p1 1-1")]
    assert count_links([Alignment.of([(0, 0), (1, 1)])], gold).aer == 0.0
    empty = count_links([Alignment()], gold)
    assert (empty.aer, empty.precision, empty.recall) == (1.0, None, 0.0)
    assert count_links([Alignment()], [Alignment()]).aer is None


def test_gold_of_another_length_is_refused():
    with pytest.raises(AlignmentError, match="2 predicted alignments but 1 gold"):
        count_links([Alignment(), Alignment()], [Alignment()])


def test_repr_is_the_pharaoh_line():
    assert repr(parse_line("1-p1 0-0")) == "Alignment('0-0 1-p1')"
