"""The validity audit analysing every attention call as capture hands it over (and dropping
it) gives the tables of the audit that keeps every record: on the bundled date LSTM (one
call per decoder step) and date BART (SDPA), and on decoder-only GPT-2 / Llama models
(prompt views), with and without query blocks."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from attnaudit.validity import pipeline
from attnaudit.validity.pipeline import run_validity_audit
from tests.helpers.distributed_targets import date_lstm, date_transformer

transformers = pytest.importorskip("transformers")

from tests.helpers.tiny_hf import VOCAB, save_checkpoint  # noqa: E402

TABLES = ("metrics", "sites", "regions", "site_summary")
PROMPTS = ["w5 w6 w7 w8 w9", "w10 w11", "w12 w13 w14 w15", "w16"]


def causal_target(name: str, folder):
    from attnaudit.targets.hf.loading import from_hf

    common = {"vocab_size": VOCAB, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
              "attn_implementation": "sdpa"}
    if name == "gpt2":
        config = transformers.GPT2Config(n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                         initializer_range=0.3, **common)
        cls = transformers.GPT2LMHeadModel
    else:
        config = transformers.LlamaConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=32, initializer_range=0.3, **common)
        cls = transformers.LlamaForCausalLM
    save_checkpoint(cls, config, folder, eos_after=False)
    model = cls.from_pretrained(folder, attn_implementation="sdpa").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    return from_hf(model, PROMPTS, tokenizer=tokenizer, max_new_tokens=4, batch_size=2)


@pytest.fixture(params=["date_lstm", "date_bart", "gpt2", "llama"])
def target(request, tmp_path):
    if request.param == "date_lstm":
        return date_lstm()
    if request.param == "date_bart":
        return date_transformer()
    return causal_target(request.param, tmp_path)


def assert_same_tables(streamed, kept, rtol: float = 0.0) -> None:
    for name in TABLES:
        ours, theirs = getattr(streamed, name), getattr(kept, name)
        assert list(ours.columns) == list(theirs.columns), name
        assert len(ours) == len(theirs) > 0 or name == "regions", name
        for column in ours.columns:
            a, b = ours[column], theirs[column]
            if pd.api.types.is_float_dtype(a) and rtol:
                np.testing.assert_allclose(a.to_numpy(float), b.to_numpy(float), rtol=rtol,
                                           atol=0.0, err_msg=f"{name}.{column}")
            else:
                pd.testing.assert_series_equal(a, b, check_exact=True, obj=f"{name}.{column}")


def no_fallback(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("a streamed batch was analysed again from a kept capture")

    monkeypatch.setattr(pipeline, "kept_pass", refuse)


@pytest.mark.parametrize("checks_only", [False, True])
def test_streamed_audit_equals_the_kept_one(target, checks_only, monkeypatch):
    kept = run_validity_audit(target, limit=8, progress=False, timing=False,
                              checks_only=checks_only, keep_example=not checks_only,
                              streaming=False, keep_examples=6)
    no_fallback(monkeypatch)
    streamed = run_validity_audit(target, limit=8, progress=False, timing=False,
                                  checks_only=checks_only, keep_example=not checks_only,
                                  keep_examples=6)
    # Exact: each site is one call per pass except the LSTM's, one call per decoder step.
    # There a step's rows are summed over the examples still decoding at that step in one
    # group, where the stacked record groups examples by their whole run of steps: the same
    # numbers added in another order (float64), hence the relative 1e-12.
    assert_same_tables(streamed, kept, rtol=1e-12 if target.name == "date_lstm" else 0.0)
    assert streamed.examples == kept.examples > 0
    if checks_only:
        assert streamed.kept_examples == [] and streamed.example is None
        return
    # the first 6 examples (across batches), each map with its validity annotations
    assert [e.index for e in streamed.kept_examples] == list(range(min(6, kept.examples)))
    assert streamed.example is streamed.kept_examples[0]
    for ours, theirs in zip(streamed.kept_examples, kept.kept_examples, strict=True):
        assert (ours.index, ours.source, ours.words) == (theirs.index, theirs.source,
                                                         theirs.words)
        assert list(ours.maps) == list(theirs.maps)
        for name, drawn in ours.maps.items():
            other = theirs.maps[name]
            for field in ("weights", "eligible", "row_sum", "masked_mass"):
                assert getattr(drawn, field) is not None, field
                np.testing.assert_array_equal(getattr(drawn, field), getattr(other, field),
                                              err_msg=f"{ours.index} {name} {field}")
            assert drawn.query_labels == other.query_labels
            assert drawn.key_labels == other.key_labels


def test_kept_maps_hold_each_rows_sum_and_masked_mass_over_every_key():
    """The streamed audit's kept maps of the date BART against its kept capture, summed
    in numpy: row sums over every key, masked mass on padding (cross) and on later steps
    (decoder self-attention); keys are labelled by the decoder's inputs."""
    from attnaudit.analysis.example_maps import START_LABEL
    from attnaudit.validity.timing import kept_pass

    target = date_transformer()
    audit = run_validity_audit(target, limit=6, progress=False, timing=False,
                               keep_examples=6)
    batches = list(target.iter_batches(6))
    checked = set()
    for example in audit.kept_examples:
        batch = batches[example.index // len(batches[0])]
        row = example.index % len(batches[0])
        emitted = target.greedy(batch)
        steps = target.step_mask(emitted)[row].numpy()
        source = batch.source_mask[row].bool().numpy()
        with torch.no_grad():
            records = kept_pass(target, batch, emitted, keep=False, max_memory=None).records
        for name, drawn in example.maps.items():
            w = records[name].weights[row].double().numpy()  # (H, Q, K)
            if drawn.role == "cross":
                rows, ineligible = w[:, steps], ~source
                masked = rows[:, :, ineligible].sum(-1)
            elif drawn.role == "decoder_self":
                rows = w[:, steps]
                later = np.triu(np.ones(w.shape[1:], dtype=bool), 1)[steps]
                masked = np.where(later, rows, 0.0).sum(-1)
                assert drawn.key_labels == [START_LABEL, *drawn.query_labels[:-1]]
            else:
                continue
            np.testing.assert_allclose(drawn.row_sum, rows.sum(-1), rtol=1e-12)
            np.testing.assert_allclose(drawn.masked_mass, masked, rtol=1e-12, atol=1e-300)
            checked.add(drawn.role)
    assert checked == {"cross", "decoder_self"}


def test_query_blocks_leave_the_tables_unchanged(target, monkeypatch):
    """A budget of a few rows per block: every SDPA call is computed, recorded and analysed
    block by block. The float32 products of a block round differently from the whole
    call's (BLAS blocks the sum over the head dimension by the matrix's shape), so the
    weights agree to ~1e-7 and the statistics to 1e-5, not bit for bit; the histogram
    quantiles can move by a bin and are not compared. Counts, sites and the gate's row
    counts are exact."""
    whole = run_validity_audit(target, limit=4, progress=False, timing=False,
                               streaming=False)
    no_fallback(monkeypatch)
    blocked = run_validity_audit(target, limit=4, progress=False, timing=False,
                                 max_memory=4096)
    gaps = ["backend_parity_gap", "backend_parity_relative"]  # rounding-level, ~1e-7
    pd.testing.assert_frame_equal(blocked.sites.drop(columns=gaps), whole.sites.drop(columns=gaps))
    np.testing.assert_allclose(blocked.sites[gaps], whole.sites[gaps], atol=1e-5)
    ours, theirs = blocked.metrics, whole.metrics
    keys = ["site", "metric", "head", "step", "n"]
    pd.testing.assert_frame_equal(ours[keys], theirs[keys])
    for column in ("mean", "sum", "min", "max"):
        np.testing.assert_allclose(ours[column], theirs[column], rtol=1e-5, atol=1e-5,
                                   err_msg=column)
    counts = [c for c in whole.site_summary.columns if c.endswith("_rows") or c == "rows"]
    pd.testing.assert_frame_equal(blocked.site_summary[["site", *counts]],
                                  whole.site_summary[["site", *counts]])


def test_a_batch_whose_roles_do_not_verify_is_analysed_from_a_kept_capture(monkeypatch):
    """Two full teacher-forced calls at one site stack to twice the steps: the role read
    off the first call no longer holds, and the batch is analysed again, kept."""
    from attnaudit.record import AttentionCall, Site
    from attnaudit.validity.analysers import ValidityAnalysers
    from attnaudit.validity.batch import BatchAnalysis
    from attnaudit.validity.pipeline import _AuditState, _batch_analysis

    target = date_transformer()
    batch = next(target.iter_batches(4))
    emitted = target.greedy(batch)
    state = _AuditState(ValidityAnalysers(), {})
    analysis = _batch_analysis(target, batch, emitted, target.step_mask(emitted), state, 0)
    assert isinstance(analysis, BatchAnalysis)
    n_steps, n_source = emitted.shape[1], batch.source_ids.shape[1]
    site = Site("decoder.attn:cross", "cross", "sdpa", "decoder.attn")
    weights = torch.softmax(torch.randn(len(batch), 2, n_steps, n_source), -1)
    analysis.on_call(site, AttentionCall(weights))
    assert analysis.verified()
    analysis.on_call(replace(site, call=1, query_offset=n_steps), AttentionCall(weights))
    assert not analysis.verified()

    kept = run_validity_audit(target, limit=4, progress=False, timing=False, streaming=False)
    calls = []
    real = pipeline.kept_pass
    monkeypatch.setattr(BatchAnalysis, "verified", lambda self: False)
    monkeypatch.setattr(pipeline, "kept_pass",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    fallen_back = run_validity_audit(target, limit=4, progress=False, timing=False)
    assert calls  # every batch analysed again from a kept capture
    assert_same_tables(fallen_back, kept)
