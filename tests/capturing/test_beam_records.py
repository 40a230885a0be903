"""Beam search captures, aligned to the returned sequences by ``beam_records``.

For tiny BART, Marian and T5 checkpoints and a decoder-only GPT-2 (left-padded prompts),
built from configs (``tests/helpers/tiny_hf.py``; nothing is downloaded), a capture of
``generate(num_beams=3)`` is aligned with ``beam_records`` and compared with two
independent references:

- the capture of one teacher-forced pass over the returned sequences (no beams, no cache):
  its query row ``t`` attends as the step that chose token ``t`` did;
- Hugging Face's own eager ``output_attentions`` of the same beam search, on the folder
  loaded a second time (that model is never captured), gathered by hand through
  ``beam_indices``.

Only steps a returned sequence actually took are compared (``beam_indices >= 0``); after its
end, the aligned rows must be zero with no eligible key.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import attnaudit
from attnaudit.capturing.beams import beam_path
from attnaudit.errors import CaptureError

transformers = pytest.importorskip("transformers")

from tests.helpers.threads import one_thread  # noqa: E402, F401  (module fixture)
from tests.helpers.tiny_hf import VOCAB, save_checkpoint, tiny_config  # noqa: E402

TOL = 1e-5
BEAMS = 3
NEW_TOKENS = 6
SOURCES = ["w5 w9 w12 w7 w30 w8", "w11 w14", "w20 w21 w6 w33"]
SEQ2SEQ = {"bart": ("BartConfig", "BartForConditionalGeneration"),
           "marian": ("MarianConfig", "MarianMTModel"),
           "t5": ("T5Config", "T5ForConditionalGeneration")}



@pytest.fixture(scope="module", params=[*SEQ2SEQ, "gpt2"])
def checkpoint(request, tmp_path_factory) -> tuple[str, Path]:
    return _saved(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def bart(tmp_path_factory) -> tuple[str, Path]:
    """BART alone: what is checked with it does not depend on the architecture."""
    return _saved("bart", tmp_path_factory.mktemp("bart_alone"))


def _saved(name: str, folder: Path) -> tuple[str, Path]:
    if name == "gpt2":
        config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32,
                                         n_layer=2, n_head=4, initializer_range=0.3,
                                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
        save_checkpoint(transformers.GPT2LMHeadModel, config, folder, eos_after=False)
    else:
        config_cls, model_cls = SEQ2SEQ[name]
        save_checkpoint(getattr(transformers, model_cls),
                        tiny_config(getattr(transformers, config_cls)), folder)
    return name, folder


def _load(name: str, folder: Path, backend: str) -> torch.nn.Module:
    cls = transformers.GPT2LMHeadModel if name == "gpt2" else \
        getattr(transformers, SEQ2SEQ[name][1])
    return cls.from_pretrained(folder, attn_implementation=backend).eval()


def _inputs(name: str, folder: Path) -> dict[str, torch.Tensor]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    tokenizer.padding_side = "left" if name == "gpt2" else "right"
    enc = tokenizer(SOURCES, padding=True, return_tensors="pt")
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


def _generate(model: torch.nn.Module, inputs: dict, **extra) -> object:
    config = model.config
    with torch.no_grad():
        return model.generate(**inputs, num_beams=BEAMS, max_new_tokens=NEW_TOKENS,
                              min_new_tokens=2, do_sample=False, early_stopping=True,
                              return_dict_in_generate=True, output_scores=True,
                              pad_token_id=config.pad_token_id,
                              eos_token_id=config.eos_token_id, **extra)


def _teacher_forced(name: str, model: torch.nn.Module, inputs: dict,
                    sequences: torch.Tensor) -> dict[str, attnaudit.AttentionRecord]:
    """The capture of one pass over the returned sequences, without a cache."""
    with torch.no_grad(), attnaudit.capture(model) as cap:
        if name == "gpt2":
            mask = torch.cat([inputs["attention_mask"],
                              torch.ones_like(sequences[:, inputs["input_ids"].shape[1]:])],
                             dim=1)[:, :-1]
            model(input_ids=sequences[:, :-1], attention_mask=mask,
                  position_ids=(mask.cumsum(-1) - 1).clamp_min(0), use_cache=False)
        else:
            model(**inputs, decoder_input_ids=sequences[:, :-1], use_cache=False)
    return cap.records


def _steps(name: str, inputs: dict) -> slice:
    """Teacher-forced query rows of the generated steps."""
    start = inputs["input_ids"].shape[1] - 1 if name == "gpt2" else 0
    return slice(start, None)


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    width = max(a.shape[-1], b.shape[-1])
    a = torch.nn.functional.pad(a, (0, width - a.shape[-1]))
    b = torch.nn.functional.pad(b, (0, width - b.shape[-1]))
    torch.testing.assert_close(a.float(), b.float(), atol=TOL, rtol=0)


def test_aligned_rows_equal_teacher_forcing_and_eager_attentions(checkpoint):
    name, folder = checkpoint
    model, eager = _load(name, folder, "sdpa"), _load(name, folder, "eager")
    inputs = _inputs(name, folder)
    with attnaudit.capture(model) as cap:
        out = _generate(model, inputs)
    truth = _generate(eager, inputs, output_attentions=True)
    assert torch.equal(out.sequences, truth.sequences)
    path = out.beam_indices
    live = path >= 0
    assert (path[:, 1:] != path[:, :1]).any(), "the beams never reorder: the test is idle"
    aligned = attnaudit.beam_records(cap, out)
    assert list(aligned) == list(cap.records)

    tf = _teacher_forced(name, model, inputs, out.sequences)
    steps, decoder_sites = path.shape[1], _decoder_sites(cap)
    for site, record in aligned.items():
        reference = tf[site].weights
        if site in decoder_sites:
            assert len(record.calls) == steps
            reference = reference[:, :, _steps(name, inputs)][:, :, :steps]
            got = record.weights.masked_fill(~live[:, None, :, None], 0)
            want = reference.masked_fill(~live[:, None, :, None], 0)
            _close(got, want)
            ended = record.weights[~live[:, None, :].expand(-1, record.weights.shape[1], -1)]
            assert not ended.any()
            assert not record.key_mask.expand_as(record.weights)[
                (~live)[:, None, :, None].expand_as(record.weights)].any()
        else:  # the encoder: run once per example
            _close(record.weights, reference)

    for site, eager_steps in _eager_by_site(name, cap, truth).items():
        gathered = [eager_steps[t][path[:, t].clamp_min(0), :, -1:] for t in range(steps)]
        width = max(g.shape[-1] for g in gathered)
        gathered = torch.cat([torch.nn.functional.pad(g, (0, width - g.shape[-1]))
                              for g in gathered], dim=2)
        want = gathered.masked_fill(~live[:, None, :, None], 0)
        _close(aligned[site].weights.masked_fill(~live[:, None, :, None], 0), want)


def _decoder_sites(cap) -> list[str]:
    """Step sites in capture order: every site of GPT-2, the decoder's of a seq2seq."""
    slots = BEAMS * len(SOURCES)
    return [site for site, r in cap.records.items() if r.calls[0].weights.shape[0] == slots]


def _eager_by_site(name: str, cap, truth) -> dict[str, list[torch.Tensor]]:
    """Site name -> the eager attentions of each step (slots, H, Q, K), matched by kind and
    order of first call."""
    sites = _decoder_sites(cap)
    if name == "gpt2":
        return {site: [step[layer] for step in truth.attentions]
                for layer, site in enumerate(sites)}
    out = {}
    for kind, steps in (("self", truth.decoder_attentions), ("cross", truth.cross_attentions)):
        for layer, site in enumerate(s for s in sites if cap.records[s].kind == kind):
            out[site] = [step[layer] for step in steps]
    assert len(out) == len(sites)
    return out


def test_a_custom_loops_parent_pointers_give_the_same_records(bart):
    """beam_path turns parent pointers into the path; a tensor path aligns as the output
    does. The parents are rebuilt from HF's own paths (one returned sequence per example;
    several per source are checked in test_beam_records_edges.py)."""
    name, folder = bart
    model = _load(name, folder, "sdpa")
    inputs = _inputs(name, folder)
    with attnaudit.capture(model) as cap:
        out = _generate(model, inputs)
    path = out.beam_indices
    slots = BEAMS * len(SOURCES)
    # parents[t, s]: the slot holding, after step t, a prefix that slot path[i, t] chose
    parents = torch.zeros(path.shape[1], slots, dtype=torch.long)
    full = path[:, -1] >= 0
    final = torch.arange(path.shape[0]) * BEAMS  # any distinct slot per sequence
    for i in torch.nonzero(full).flatten().tolist():
        holder = int(final[i])
        for t in range(path.shape[1] - 1, -1, -1):
            parents[t, holder] = path[i, t]
            holder = int(path[i, t])
    rebuilt = beam_path(parents, final[full])
    assert torch.equal(rebuilt, path[full].long())
    by_tensor = attnaudit.beam_records(cap.records, path, slots=slots)
    by_output = attnaudit.beam_records(cap, out)
    for site in by_output:
        torch.testing.assert_close(by_tensor[site].weights, by_output[site].weights,
                                   atol=0, rtol=0)


def test_pointers_that_do_not_fit_are_clear_errors(bart):
    name, folder = bart
    model = _load(name, folder, "sdpa")
    inputs = _inputs(name, folder)
    with attnaudit.capture(model) as cap:
        out = _generate(model, inputs)
    slots = BEAMS * len(SOURCES)
    with pytest.raises(CaptureError, match=r"back-pointers must lie in -1\.\.8"):
        attnaudit.beam_records(cap, out.beam_indices + slots, slots=slots)
    with pytest.raises(CaptureError, match="calls for"):
        attnaudit.beam_records(cap, torch.zeros(3, 50, dtype=torch.long), slots=slots)
    with pytest.raises(CaptureError, match="no beam_indices"):
        attnaudit.beam_records(cap, object())
