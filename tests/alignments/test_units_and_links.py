"""Units (subwords merged into words, tokens), the two step conventions, and links read from
a hand-written map, against hand computations."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from attnaudit.alignments.extract import links_from_maps
from attnaudit.alignments.maps import layer_map
from attnaudit.alignments.units import batch_units
from attnaudit.errors import AlignmentError
from attnaudit.targets.contract import Batch, Seq2SeqTarget

PAD, EOS = 0, 1
SOURCE = [["▁un", "believ", "able", "▁day", "</s>", "<pad>"],
          ["▁good", "▁night", "</s>", "<pad>", "<pad>", "<pad>"]]
OUTPUT = [["▁un", "glaub", "lich", "er", "▁Tag", "</s>"],
          ["▁gute", "▁Nacht", "</s>", "</s>", "</s>", "</s>"]]
SOURCE_IDS = torch.tensor([[5, 6, 7, 8, EOS, PAD], [9, 10, EOS, PAD, PAD, PAD]])
EMITTED = torch.tensor([[11, 12, 13, 14, 15, EOS], [16, 17, EOS, EOS, EOS, EOS]])


def fake_target() -> tuple[Seq2SeqTarget, Batch]:
    labels = {int(i): t for row, ids in zip(OUTPUT, EMITTED, strict=True)
              for t, i in zip(row, ids, strict=True)}
    batch = Batch(SOURCE_IDS, SOURCE_IDS != PAD, ["unbelievable day", "good night"])
    target = Seq2SeqTarget(
        name="fake", model=nn.Identity(), batches=lambda: [batch], greedy=lambda b: EMITTED,
        teacher_forced=lambda b, e: torch.zeros(*e.shape, 20), source_embedding=None,
        source_tokens=lambda b: SOURCE, eos_id=EOS, special_ids=(PAD, EOS),
        target_tokens=lambda e: [[labels[int(i)] for i in row] for row in e])
    return target, batch


def test_subwords_merge_into_words_on_both_sides():
    target, batch = fake_target()
    units = batch_units(target, batch, EMITTED, "words", "emit")
    assert units.source.tolist() == [[0, 0, 0, 1, -1, -1], [0, 1, -1, -1, -1, -1]]
    assert units.rule == "located"
    # "▁un glaub lich er" is output word 0 (steps 0-3), "▁Tag" word 1 (step 4)
    assert units.rows == [[[0, 1, 2, 3], [4]], [[0], [1]]]
    assert units.n_source == [2, 2]


def test_input_convention_reads_the_next_step():
    target, batch = fake_target()
    units = batch_units(target, batch, EMITTED, "words", "input")
    # token j is the decoder input at step j + 1; the end-of-sequence step follows "▁Tag"
    assert units.rows == [[[1, 2, 3, 4], [5]], [[1], [2]]]
    cut = EMITTED[:, :5]  # no end-of-sequence step after "▁Tag": it has no input row
    assert batch_units(target, batch, cut, "words", "input").rows[0] == [[1, 2, 3, 4], []]


def test_token_units_number_the_eligible_tokens():
    target, batch = fake_target()
    units = batch_units(target, batch, EMITTED, "tokens", "emit")
    assert units.source.tolist() == [[0, 1, 2, 3, -1, -1], [0, 1, -1, -1, -1, -1]]
    assert units.rows == [[[0], [1], [2], [3], [4]], [[0], [1]]]


def test_links_are_the_argmax_of_summed_word_scores():
    target, batch = fake_target()
    gen = np.random.default_rng(0)
    maps = gen.random((2, 6, 6))
    units = batch_units(target, batch, EMITTED, "words", "emit")
    found = links_from_maps(torch.from_numpy(maps), units)
    # example 0 by hand: source word 0 = keys 0..2, word 1 = key 3; target word 0 = rows 0..3
    word0 = maps[0, 0:4, 0:3].sum(), maps[0, 0:4, 3].sum()
    word1 = maps[0, 4, 0:3].sum(), maps[0, 4, 3]
    assert found[0].sure == {(int(np.argmax(word0)), 0), (int(np.argmax(word1)), 1)}
    assert found[1].sure == {(int(np.argmax(maps[1, 0, :2])), 0),
                             (int(np.argmax(maps[1, 1, :2])), 1)}


def test_a_constant_row_gets_no_link():
    target, batch = fake_target()
    units = batch_units(target, batch, EMITTED, "tokens", "emit")
    maps = torch.zeros(2, 6, 6)
    maps[0, 1, 2] = 1.0
    maps[1, 0, 0] = torch.nan
    found = links_from_maps(maps, units)
    assert found[0].sure == {(2, 1)}
    assert found[1].sure == set()


def test_layer_map_picks_or_averages_layers():
    maps = torch.arange(24.0).reshape(1, 3, 2, 4)
    assert torch.equal(layer_map(maps, 1), maps[:, 1])
    assert torch.equal(layer_map(maps, -1), maps[:, 2])
    assert torch.allclose(layer_map(maps, "mean"), (maps[:, 0] + maps[:, 1] + maps[:, 2]) / 3)
    with pytest.raises(AlignmentError, match="3 layer"):
        layer_map(maps, 3)


@pytest.mark.parametrize(("units", "convention"), [("lemmas", "emit"), ("words", "next")])
def test_unknown_units_or_convention_are_refused(units, convention):
    target, batch = fake_target()
    with pytest.raises(AlignmentError):
        batch_units(target, batch, EMITTED, units, convention)
