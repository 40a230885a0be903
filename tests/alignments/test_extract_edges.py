"""Alignment extraction at the edge: a source of one unit.

With a single source unit there is nothing to choose between, so every target unit with a
finite row is linked to it, even when its scores are all zero; a non-finite row and a unit
with no row still get no link. Source units are found by ``batch_units`` as the align
command finds them (a word of three subword tokens; one token); the expected links are
written out by hand.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from attnaudit.alignments.extract import links_from_maps
from attnaudit.alignments.units import batch_units
from attnaudit.targets.contract import Batch, Seq2SeqTarget

PAD, EOS = 0, 1
SOURCE = [["▁un", "believ", "able", "</s>"], ["▁day", "</s>", "<pad>", "<pad>"]]
OUTPUT = [["▁un", "glaub", "▁Tag", "</s>"], ["▁gute", "▁Nacht", "</s>", "</s>"]]
SOURCE_IDS = torch.tensor([[5, 6, 7, EOS], [8, EOS, PAD, PAD]])
EMITTED = torch.tensor([[11, 12, 13, EOS], [14, 15, EOS, EOS]])


def one_unit_target() -> tuple[Seq2SeqTarget, Batch]:
    labels = {int(i): t for row, ids in zip(OUTPUT, EMITTED, strict=True)
              for t, i in zip(row, ids, strict=True)}
    batch = Batch(SOURCE_IDS, SOURCE_IDS != PAD, ["unbelievable", "day"])
    target = Seq2SeqTarget(
        name="one unit", model=nn.Identity(), batches=lambda: [batch],
        greedy=lambda b: EMITTED, teacher_forced=lambda b, e: torch.zeros(*e.shape, 20),
        source_embedding=None, source_tokens=lambda b: SOURCE, eos_id=EOS,
        special_ids=(PAD, EOS),
        target_tokens=lambda e: [[labels[int(i)] for i in row] for row in e])
    return target, batch


def test_a_one_word_and_a_one_token_source_link_every_target_word_to_it():
    target, batch = one_unit_target()
    units = batch_units(target, batch, EMITTED, "words", "emit")
    assert units.n_source == [1, 1]
    assert units.source.tolist() == [[0, 0, 0, -1], [0, -1, -1, -1]]
    assert units.rows == [[[0, 1], [2]], [[0], [1]]]
    maps = torch.from_numpy(np.random.default_rng(0).random((2, 4, 4)))
    found = links_from_maps(maps, units)
    assert found[0].sure == {(0, 0), (0, 1)}
    assert found[1].sure == {(0, 0), (0, 1)}
    assert found[0].to_line() == "0-0 0-1"


def test_with_one_source_unit_all_zero_scores_still_link_and_non_finite_ones_do_not():
    target, batch = one_unit_target()
    units = batch_units(target, batch, EMITTED, "tokens", "emit")
    assert units.n_source == [3, 1]
    maps = torch.zeros(2, 4, 4, dtype=torch.float64)
    maps[1, 1, 0] = torch.nan  # example 1's second output token: no information
    found = links_from_maps(maps, units)
    assert found[1].sure == {(0, 0)}  # zero scores, one choice: linked
    assert found[0].sure == set()  # three source tokens, all scores equal: undecided
    # input convention, no end-of-sequence step after "▁Nacht": it has no row, no link
    cut = batch_units(target, batch, EMITTED[:, :2], "words", "input")
    assert cut.rows[1] == [[1], []]
    assert links_from_maps(torch.ones(2, 2, 4), cut)[1].sure == {(0, 0)}
