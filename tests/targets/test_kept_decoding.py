"""A Hugging Face target keeps the logits of its latest one-hypothesis decoding, and its next
``cached_decode`` of the same inputs and output returns them instead of decoding again;
anything that could make a second decoding differ (a weight changed in place, another
output, an edit held while decoding, beams) decodes again.

Ground truth is the model's own ``generate(output_logits=True)`` called by hand on the
model as it is at the comparison; ``model.generate`` is counted on the instance.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import attnaudit
from attnaudit.targets import kept_decoding

transformers = pytest.importorskip("transformers")

from tests.helpers.tiny_causal import tiny_causal_checkpoint  # noqa: E402
from tests.helpers.tiny_hf import save_checkpoint, tiny_config  # noqa: E402

PROMPTS = ["w10 w11 w12 w13 w14 w15", "w20 w21 w22 w23"]
NEW_TOKENS = 5
TOL = 1e-5


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    causal = tiny_causal_checkpoint("llama", tmp_path_factory.mktemp("llama"))[0]
    seq2seq = tmp_path_factory.mktemp("bart")
    save_checkpoint(transformers.BartForConditionalGeneration,
                    tiny_config(transformers.BartConfig), seq2seq)
    return {"causal": causal, "seq2seq": seq2seq}


def _target(folders: dict[str, Path], family: str, **options):
    return attnaudit.from_hf(folders[family], PROMPTS, max_new_tokens=NEW_TOKENS,
                             decoding="greedy", **options)


def _counted(model) -> list[str]:
    """Each later ``model.generate`` call: ``forced`` (a logits processor forcing an output:
    the cached decoding run again), ``kept`` (a decoding that asks for its logits) or
    ``plain``."""
    calls: list[str] = []
    generate = model.generate

    def counting(*args, **kwargs):
        calls.append("forced" if kwargs.get("logits_processor") else
                     "kept" if kwargs.get("output_logits") else "plain")
        return generate(*args, **kwargs)

    model.generate = counting
    return calls


def _by_hand(target, batch, emitted: torch.Tensor) -> torch.Tensor:
    """(B, T, V): the model's own generate() forced along ``emitted``, logits kept."""
    model, seq2seq = target.model, target.model.config.is_encoder_decoder
    forced = emitted.clone()

    class Forced(transformers.LogitsProcessor):
        def __call__(self, input_ids, scores):
            step = input_ids.shape[1] - (1 if seq2seq else batch.source_ids.shape[1])
            return torch.full_like(scores, -torch.inf).scatter_(1, forced[:, step, None], 0.0)

    start = {"decoder_start_token_id": model.config.decoder_start_token_id} if seq2seq else {}
    pad = target.greedy.__self__.pad_id
    with torch.no_grad():
        out = model.generate(input_ids=batch.source_ids, attention_mask=batch.source_mask.long(),
                             do_sample=False, num_beams=1, max_new_tokens=emitted.shape[1],
                             logits_processor=transformers.LogitsProcessorList([Forced()]),
                             output_logits=True, return_dict_in_generate=True,
                             pad_token_id=pad, eos_token_id=target.eos_id, **start)
    return torch.stack(out.logits, 1).float()


@pytest.mark.parametrize("family", ["causal", "seq2seq"])
def test_the_cached_decoding_after_a_decoding_is_its_kept_logits_taken_once(folders, family):
    target = _target(folders, family)
    batch = next(target.iter_batches())
    calls = _counted(target.model)
    emitted = target.greedy(batch)
    kept = target.cached_decode(batch, emitted)
    assert calls == ["kept"]  # cached_decode decoded nothing
    truth = _by_hand(target, batch, emitted)
    assert kept.shape == truth.shape and (kept - truth).abs().max() <= TOL
    calls.clear()
    again = target.cached_decode(batch, emitted)  # taken once: decoded again
    assert calls == ["forced"] and (again.float() - truth).abs().max() <= TOL


def _changed_weight(target, batch, emitted):
    with torch.no_grad():
        target.model.get_output_embeddings().weight.mul_(1.5)
    return emitted


def _other_output(target, batch, emitted):
    other = emitted.clone()
    other[:, -1] = (other[:, -1] + 1) % target.model.config.vocab_size
    return other


@pytest.mark.parametrize("change", [_changed_weight, _other_output])
@pytest.mark.parametrize("family", ["causal", "seq2seq"])
def test_a_changed_weight_or_another_output_is_decoded_again(folders, family, change):
    target = _target(folders, family)
    batch = next(target.iter_batches())
    emitted = target.greedy(batch)
    asked = change(target, batch, emitted)
    calls = _counted(target.model)
    logits = target.cached_decode(batch, asked)
    assert calls == ["forced"]
    truth = _by_hand(target, batch, asked)
    assert (logits.float() - truth).abs().max() <= TOL


@pytest.mark.parametrize("family", ["causal", "seq2seq"])
def test_a_decoding_under_an_edit_or_with_beams_keeps_nothing(folders, family):
    target = _target(folders, family)
    batch = next(target.iter_batches())
    calls = _counted(target.model)
    with attnaudit.capture(target.model, edit=lambda site, weights, mask: weights * 0.5):
        edited = target.greedy(batch)
    target.cached_decode(batch, edited)
    assert calls == ["plain", "forced"]  # the edited decoding asked for no logits

    beams = attnaudit.from_hf(folders[family], PROMPTS, decoding="model",
                              generation={"num_beams": 2, "max_new_tokens": NEW_TOKENS})
    calls = _counted(beams.model)
    emitted = beams.greedy(batch)
    beams.cached_decode(batch, emitted)
    assert calls == ["plain", "forced"]


def test_logits_beyond_the_budget_are_not_kept(folders, monkeypatch):
    target = _target(folders, "causal")
    batch = next(target.iter_batches())
    whole = 4 * len(PROMPTS) * NEW_TOKENS * target.model.config.vocab_size  # float32 bytes
    monkeypatch.setattr(kept_decoding, "KEPT_LOGITS_BYTES", whole - 1)
    calls = _counted(target.model)
    target.cached_decode(batch, target.greedy(batch))
    assert calls == ["plain", "forced"]
    monkeypatch.setattr(kept_decoding, "KEPT_LOGITS_BYTES", whole)
    calls.clear()
    target.cached_decode(batch, target.greedy(batch))
    assert calls == ["kept"]
