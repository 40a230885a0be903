"""The date alignment audit (``python -m attnaudit_examples.alignment_audit``) for both date models.

The LSTM's numbers are recomputed here from its decoder written out from its parameters
(the audit captures the teacher-forced pass over the greedy output: for this model the same
computation) and pinned to the README's published figures. For the BART only structural facts
are asserted, and the bounds it does meet (see examples/date_transformer/README.md).
"""

from __future__ import annotations

import math

import pytest
import torch

from attnaudit_examples import alignment_audit
from attnaudit_examples.alignment_audit import MEAN_HEAD, audit_date, format_headline
from attnaudit_examples.date.data import YEAR_CHARS, encode_sources, year_span
from tests.helpers.date_reference import hand_written_decode

BART_SOURCES = 100  # region metrics on the first 100 audit sources keep the test short
METRICS = ["region_mass", "top_weight_hit", "entropy_norm", "max_weight"]


@pytest.fixture(scope="module")
def date_audit():
    return audit_date()


# The README's published figures, pinned within half a percentage point.
PUBLISHED = {"region_mass": 0.981, "top_weight_hit": 0.996, "exact_match": 1.000}
PINNED = 0.005


def test_date_numbers_match_a_hand_written_decoder(date_audit, date_splits, date_vocabs,
                                                    date_model):
    """Region mass, top-weight hit and exact match from the date model's decoder written out
    from its parameters (no capture, no model loop), pinned to the README's figures; the
    audit must report the same numbers."""
    src_vocab, tgt_vocab = date_vocabs
    sources = [s for s, _ in date_splits.unambiguous("valid", 400)]
    src, lengths = encode_sources(src_vocab, sources)
    weights, _, _ = hand_written_decode(date_model, src, lengths)
    first = weights[:, :YEAR_CHARS].double()  # (400, 4, n)
    year = torch.zeros(len(sources), first.shape[-1], dtype=torch.bool)
    for row, source in enumerate(sources):
        year[row, list(year_span(source))] = True
    year = year[:, None, :].expand_as(first)
    mass = (first * year).sum(-1).mean().item()
    hit = year.gather(-1, first.argmax(-1, keepdim=True)).double().mean().item()
    test = date_splits.unambiguous("test")
    src, lengths = encode_sources(src_vocab, [s for s, _ in test])
    _, _, emitted = hand_written_decode(date_model, src, lengths)
    exact = sum(tgt_vocab.decode(ids) == iso
                for ids, (_, iso) in zip(emitted.tolist(), test, strict=True)) / len(test)
    measured = {"region_mass": mass, "top_weight_hit": hit, "exact_match": exact}
    for name, value in measured.items():
        assert value == pytest.approx(PUBLISHED[name], abs=PINNED), name
    top = date_audit.headline()
    assert (date_audit.n_sources, date_audit.n_test) == (400, len(test)) == (400, 437)
    assert top["site"] == "attend:cross" and top["head"] == 0
    assert top["rows"] == 400 * YEAR_CHARS
    assert top["region_mass"] == pytest.approx(mass, abs=1e-6)
    assert top["top_weight_hit"] == pytest.approx(hit, abs=1e-9)
    assert date_audit.exact_match == pytest.approx(exact, abs=1e-12)


def test_command_prints_the_numbers_beside_the_seed(date_audit, monkeypatch, capsys):
    monkeypatch.setitem(alignment_audit.AUDITS, "date", lambda: date_audit)
    alignment_audit.main(["date"])
    out = capsys.readouterr().out
    assert format_headline(date_audit) in out
    for label, seed in (("year-region mass", "97.5%"), ("top-weight hit", "99.7%"),
                        ("exact match, 437", "100.0%")):
        line = next(line for line in out.splitlines() if label in line)
        assert line.rstrip().endswith(seed)


def test_date_transformer_structure():
    pytest.importorskip("transformers")
    result = alignment_audit.audit_date_transformer(limit=BART_SOURCES)
    table = result.table
    sites = [f"model.decoder.layers.{i}.encoder_attn:cross" for i in (0, 1)]
    assert sorted(set(table["site"])) == sites
    assert table.groupby("site")["head"].apply(sorted).tolist() == [[MEAN_HEAD, 0, 1, 2, 3]] * 2
    assert (table["rows"] == BART_SOURCES * YEAR_CHARS).all()
    values = table[METRICS].to_numpy(float)
    assert all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in values.flat)
    # mass is linear in the weights: the head average's mass is the mean of the heads'
    for _, site in table.groupby("site"):
        heads = site[site["head"] != MEAN_HEAD]
        mean = site[site["head"] == MEAN_HEAD]
        assert mean["region_mass"].item() == pytest.approx(heads["region_mass"].mean(),
                                                           abs=1e-12)
    top = result.headline()
    assert top["site"] == sites[1] and top["head"] == MEAN_HEAD
    assert result.n_test == 437 and result.exact_match >= 0.95
    # bounds this model meets (measured on all 400 sources in its README)
    assert top["top_weight_hit"] >= 0.99
    assert table["region_mass"].max() >= 0.9
