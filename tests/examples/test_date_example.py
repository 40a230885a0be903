"""The bundled date task and model reproduce the textbook setup."""

from __future__ import annotations

import subprocess
import sys

import pytest

from attnaudit_examples.date.data import encode_sources, is_ambiguous


def test_split_and_unambiguous_subsets_match_the_seed(date_splits):
    sizes = (len(date_splits.train), len(date_splits.valid), len(date_splits.test))
    assert sizes == (8000, 500, 500)
    assert date_splits.valid[0] == ("may 17, 1971", "1971-05-17")
    assert len(date_splits.unambiguous("test")) == 437
    assert is_ambiguous("03/04/1999") and not is_ambiguous("03/14/1999")
    sources = [s for part in (date_splits.train, date_splits.valid, date_splits.test)
               for s, _ in part]
    assert len(set(sources)) == 9000


def test_model_size_and_vocabularies(date_model, date_vocabs):
    assert sum(p.numel() for p in date_model.parameters()) == 269_550
    assert (len(date_vocabs[0]), len(date_vocabs[1])) == (37, 14)


def test_committed_checkpoint_is_trained(date_model, date_splits, date_vocabs):
    src_vocab, tgt_vocab = date_vocabs
    test = date_splits.unambiguous("test")
    src, lengths = encode_sources(src_vocab, [s for s, _ in test])
    decoded = [tgt_vocab.decode(r.tolist()) for r in date_model.greedy(src, lengths)]
    exact = sum(d == t for d, (_, t) in zip(decoded, test, strict=True)) / len(test)
    assert exact >= 0.99


@pytest.mark.slow
def test_demo_command_runs():
    result = subprocess.run([sys.executable, "-m", "attnaudit.cli", "demo"], capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "sites found: ['attend:cross']" in result.stdout
    assert "year-region mass" in result.stdout
