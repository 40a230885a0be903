"""The bundled date BART: offline, small, trained, default SDPA backend, capturable."""

from __future__ import annotations

import pytest
import torch

import attnaudit

pytest.importorskip("transformers")

from attnaudit_examples.date_transformer.model import MODEL_DIR, exact_match, load_model


@pytest.fixture(scope="module")
def bart():
    return load_model()


def test_checkpoint_is_small_and_loads_offline_on_sdpa(bart):
    model, tokenizer = bart
    size = sum(p.stat().st_size for p in MODEL_DIR.iterdir())
    assert size < 5 * 2**20
    assert model.config._attn_implementation == "sdpa"
    source = "may 17, 1971"
    ids = tokenizer(source)["input_ids"]
    assert len(ids) == len(source) + 1  # one token per character, then </s>
    assert tokenizer.decode(ids, skip_special_tokens=True) == source


def test_exact_match_on_unambiguous_test_sources(bart, date_splits):
    model, tokenizer = bart
    assert exact_match(model, tokenizer, date_splits.unambiguous("test")) >= 0.95


def test_generate_cross_attention_is_captured_per_step(bart, date_splits):
    model, tokenizer = bart
    sources = [s for s, _ in date_splits.unambiguous("valid", 16)]
    enc = tokenizer(sources, padding=True, return_tensors="pt")
    with torch.no_grad(), attnaudit.capture(model, sites=lambda n: n.endswith(":cross")) as cap:
        out = model.generate(**enc, do_sample=False, num_beams=1, max_new_tokens=11)
    steps = out.shape[1] - 1
    layers = model.config.decoder_layers
    assert len(cap.records) == layers
    rec = cap.records[f"model.decoder.layers.{layers - 1}.encoder_attn:cross"]
    heads = model.config.decoder_attention_heads
    assert rec.weights.shape == (16, heads, steps, enc["input_ids"].shape[1])
    assert len(rec.calls) == steps
    # source padding is ineligible and receives no weight
    pad = enc["attention_mask"] == 0
    assert not rec.key_mask.expand_as(rec.weights)[pad[:, None, None, :].expand_as(
        rec.weights)].any()
    assert rec.weights.masked_select(pad[:, None, None, :]).abs().max() == 0
