"""attnaudit.testing.assert_attention_healthy: the gate's checks inside a pytest test."""

from __future__ import annotations

import pytest
import torch

from attnaudit.testing import assert_attention_healthy
from tests.helpers.fingerprints import assert_unchanged, model_fingerprint
from tests.helpers.toys.masking import BOS, SOURCES, UNPADDED_SOURCES, ToySeq2Seq, source_batch

KINDS = {"attend": "cross"}


def runner(model: ToySeq2Seq, sources=SOURCES, steps: int = 3):
    batch = source_batch(sources)
    tgt_in = torch.full((len(batch), steps), BOS)
    return batch, (lambda: model(batch.source_ids, tgt_in))


def test_healthy_model_passes_and_returns_findings():
    model = ToySeq2Seq("correct")
    batch, run = runner(model)
    findings = assert_attention_healthy(model, run, kinds=KINDS,
                                        eligible={"attend": batch.source_mask})
    assert {f.site for f in findings} == {"attend:cross"}
    assert all(f.status == "pass" for f in findings)


@pytest.mark.parametrize("masking", ["zero_fill", "after_softmax"])
def test_leaks_fail_against_a_declared_rule_and_leave_the_model_unchanged(masking):
    model = ToySeq2Seq(masking)
    before = model_fingerprint(model)
    batch, run = runner(model)
    pad_rows = int((~batch.source_mask).any(-1).sum()) * 3  # every step of a padded source
    with pytest.raises(AssertionError) as failure:
        assert_attention_healthy(model, run, kinds=KINDS,
                                 eligible={"attend:cross": batch.source_mask})
    message = str(failure.value)
    assert "at 1 site(s): attend:cross" in message
    assert f"attend:cross: masked_mass: {pad_rows} of 15 rows" in message
    assert_unchanged(model, before)
    # without a declared rule the key mask comes from the model itself and hides the leak
    assert_attention_healthy(model, run, kinds=KINDS)


def test_nan_on_an_all_padding_source_fails_without_a_declared_rule():
    model = ToySeq2Seq("correct")
    _, run = runner(model, (*SOURCES, []))
    with pytest.raises(AssertionError, match=r"all_masked_nan: 3 rows with every key masked"):
        assert_attention_healthy(model, run, kinds=KINDS)


def test_tolerance_and_unknown_site_names():
    model = ToySeq2Seq("zero_fill")
    batch, run = runner(model)
    assert_attention_healthy(model, run, kinds=KINDS, eligible={"attend": batch.source_mask},
                             max_masked_mass=1.0)
    with pytest.raises(ValueError, match=r"sites that were not captured: \['decoder.attn'\]"):
        assert_attention_healthy(model, run, kinds=KINDS,
                                 eligible={"decoder.attn": batch.source_mask})


def test_a_softmax_over_the_query_axis_fails_the_softmax_axis_check_despite_a_source_rule():
    """4 decoder steps over 3-token sources, normalised over the steps: the recorded keys are
    the steps, so the declared source rule (B, 3) cannot be their eligibility; the site is
    checked without it and fails on the axis, not with a shape error."""
    model = ToySeq2Seq("wrong_axis")
    batch, run = runner(model, UNPADDED_SOURCES, steps=4)
    before = model_fingerprint(model)
    rows = len(UNPADDED_SOURCES) * 3  # the recorded rows are the model's source positions
    with pytest.raises(AssertionError) as failure:
        assert_attention_healthy(model, run, eligible={"attend": batch.source_mask})
    assert f"attend: softmax_axis: {rows} rows were normalised over an axis" in str(failure.value)
    assert_unchanged(model, before)
