"""The seed's no-attention baseline (examples/date/baseline.py) and its committed checkpoint.

The exact match is recomputed here from the model's greedy ids: characters up to the first
``</s>``, compared with the gold ISO strings.
"""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import attnaudit
from attnaudit_examples.alignment_audit import AlignmentAudit, format_baseline
from attnaudit_examples.date.baseline import DateBaselineModel, load_baseline
from attnaudit_examples.date.data import BOS, EOS, encode_sources

MEASURED_EXACT_MATCH = 434 / 437  # 99.31 %, examples/date/README.md; the seed's run: 93.1 %
ATTENTION_EXACT_MATCH = 1.0  # the committed attention model (test_date_example.py)


@pytest.fixture(scope="module")
def baseline() -> DateBaselineModel:
    return load_baseline()


@pytest.fixture(scope="module")
def test_batch(date_splits, date_vocabs):
    """The 437 unambiguous test sources: ids (437, n), lengths (437,), gold ISO strings."""
    pairs = date_splits.unambiguous("test")
    src, lengths = encode_sources(date_vocabs[0], [s for s, _ in pairs])
    return src, lengths, [t for _, t in pairs]


def exact_match(model: torch.nn.Module, test_batch, tgt_itos: list[str]) -> float:
    src, lengths, gold = test_batch
    emitted = model.greedy(src, lengths)
    assert emitted.shape == (len(gold), 11)
    hits = 0
    for row, iso in zip(emitted.tolist(), gold, strict=True):
        if EOS in row:  # no </s> in 11 steps: not an exact match
            hits += "".join(tgt_itos[i] for i in row[: row.index(EOS)]) == iso
    return hits / len(gold)


def test_parameter_count_matches_the_seed(date_vocabs):
    model = DateBaselineModel(len(date_vocabs[0]), len(date_vocabs[1]))
    assert sum(p.numel() for p in model.parameters()) == 169_326


def test_committed_checkpoint_exact_match(baseline, date_model, test_batch, date_vocabs):
    itos = date_vocabs[1].itos
    exact = exact_match(baseline, test_batch, itos)
    assert exact == pytest.approx(MEASURED_EXACT_MATCH, abs=0.005)
    attention = exact_match(date_model, test_batch, itos)
    assert attention == ATTENTION_EXACT_MATCH
    assert exact < attention


def test_fused_teacher_forcing_equals_the_greedy_steps(baseline, test_batch):
    src, lengths, _ = test_batch
    emitted = baseline.greedy(src, lengths)
    inputs = torch.cat([torch.full_like(emitted[:, :1], BOS), emitted[:, :-1]], dim=1)
    with torch.no_grad():
        logits = baseline(src, lengths, inputs)
    assert logits.shape == (len(src), 11, 14)
    assert torch.equal(logits.argmax(-1), emitted)


def test_baseline_has_no_attention(baseline, test_batch):
    src, lengths, _ = test_batch
    with pytest.raises(attnaudit.NoAttentionFound), torch.no_grad(), \
            attnaudit.capture(baseline):
        baseline.greedy(src[:8], lengths[:8])


def test_alignment_audit_prints_the_baseline_beside_the_seed():
    attention = AlignmentAudit("date", pd.DataFrame(), ATTENTION_EXACT_MATCH, 437, 400)
    lines = format_baseline(attention).splitlines()
    assert "437 unambiguous test sources" in lines[0]
    with_attention = next(line for line in lines if "additive attention" in line)
    without = next(line for line in lines if "no attention" in line)
    assert with_attention.split()[-3:] == ["269,550", "100.0%", "100.0%"]
    assert without.split()[-3:] == ["169,326", f"{MEASURED_EXACT_MATCH:.1%}", "93.1%"]
