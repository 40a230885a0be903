"""Beam-aligned records beyond the weights, on the bundled date BART.

``beam_records`` also carries each aligned row's key mask (which keys were eligible at the
step that chose the token), and a beam search may return several sequences per source
(``num_return_sequences``). Both are compared with Hugging Face's eager
``output_attentions`` of the same beam search on the checkpoint loaded a second time (never
captured), gathered by hand through ``beam_indices``: an eager softmax gives a masked key
exactly zero weight and an eligible one a positive weight, so the eligible keys of a step
are the keys with weight above zero. Per-example sites (the encoder) must hold, for returned
sequence ``i``, the eager encoder attention of the source it was decoded from.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import attnaudit

transformers = pytest.importorskip("transformers")

from attnaudit_examples.date_transformer.model import MODEL_DIR  # noqa: E402
from tests.helpers.threads import one_thread  # noqa: E402, F401  (module fixture)

BEAMS = 3
NEW_TOKENS = 11
# different lengths, so the sources' padding (ineligible cross-attention keys) differs
SOURCES = ["may 17, 1971", "20 april 1962", "3/4/99", "august 22, 2004"]


@pytest.fixture(scope="module")
def models() -> tuple[torch.nn.Module, torch.nn.Module, object]:
    load = transformers.BartForConditionalGeneration.from_pretrained
    sdpa = load(MODEL_DIR, local_files_only=True, attn_implementation="sdpa").eval()
    eager = load(MODEL_DIR, local_files_only=True, attn_implementation="eager").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(MODEL_DIR, local_files_only=True)
    return sdpa, eager, tokenizer


def _generate(model: Any, enc: dict, returned: int, **extra) -> Any:
    with torch.no_grad():
        return model.generate(**enc, num_beams=BEAMS, num_return_sequences=returned,
                              max_new_tokens=NEW_TOKENS, do_sample=False,
                              return_dict_in_generate=True, output_scores=True, **extra)


def _aligned_and_truth(models, returned: int):
    sdpa, eager, tokenizer = models
    enc = dict(tokenizer(SOURCES, padding=True, return_tensors="pt"))
    assert (enc["attention_mask"] == 0).any(), "no padding: the key masks are idle"
    with attnaudit.capture(sdpa) as cap:
        out = _generate(sdpa, enc, returned)
    truth = _generate(eager, enc, returned, output_attentions=True)
    assert torch.equal(out.sequences, truth.sequences)
    return cap, attnaudit.beam_records(cap, out), out.beam_indices, truth, enc


def _pad_cat(steps: list[torch.Tensor]) -> torch.Tensor:
    width = max(s.shape[-1] for s in steps)
    return torch.cat([torch.nn.functional.pad(s, (0, width - s.shape[-1])) for s in steps],
                     dim=2)


def _eager_steps(cap, truth) -> dict[str, list[torch.Tensor]]:
    """Decoder site -> the eager attentions of each step (slots, H, 1, K)."""
    slots = BEAMS * len(SOURCES)
    sites = [s for s, r in cap.records.items() if r.calls[0].weights.shape[0] == slots]
    out = {}
    for kind, steps in (("self", truth.decoder_attentions), ("cross", truth.cross_attentions)):
        for layer, site in enumerate(s for s in sites if cap.records[s].kind == kind):
            out[site] = [step[layer] for step in steps]
    assert len(out) == len(sites) > 0
    return out


@pytest.mark.parametrize("returned", [1, 2])
def test_aligned_key_masks_are_the_keys_the_eager_step_weighted(models, returned):
    cap, aligned, path, truth, enc = _aligned_and_truth(models, returned)
    assert path.shape[0] == returned * len(SOURCES)
    live = path >= 0
    steps = path.shape[1]
    checked_cross = False
    for site, eager_steps in _eager_steps(cap, truth).items():
        gathered = _pad_cat([eager_steps[t][path[:, t].clamp_min(0), :, -1:]
                             for t in range(steps)])
        eligible = (gathered > 0).any(1)  # (N, T, K) keys some head weighted
        record = aligned[site]
        mask = record.key_mask.expand_as(record.weights).any(1)
        width = max(mask.shape[-1], eligible.shape[-1])
        mask = torch.nn.functional.pad(mask, (0, width - mask.shape[-1]))
        eligible = torch.nn.functional.pad(eligible, (0, width - eligible.shape[-1]))
        assert torch.equal(mask & live[..., None], eligible & live[..., None]), site
        assert not mask[~live].any()
        if record.kind == "cross":
            # hand count: the eligible source keys of sequence i are its source's tokens
            source = enc["attention_mask"].bool()[torch.arange(path.shape[0]) // returned]
            want = source[:, None, :].expand(-1, steps, -1) & live[..., None]
            assert torch.equal(mask[..., :source.shape[1]] & live[..., None], want)
            checked_cross = True
    assert checked_cross


@pytest.mark.parametrize("returned", [1, 2])
def test_per_example_sites_give_each_returned_sequence_its_source(models, returned):
    cap, aligned, path, truth, enc = _aligned_and_truth(models, returned)
    n = path.shape[0]
    example = torch.arange(n) // returned
    encoder = [s for s, r in cap.records.items()
               if r.calls[0].weights.shape[0] == len(SOURCES)]
    assert len(encoder) == len(truth.encoder_attentions) > 0
    for site, eager in zip(encoder, truth.encoder_attentions, strict=True):
        record = aligned[site]
        assert record.weights.shape[0] == n
        torch.testing.assert_close(record.weights.float(), eager[example].float(),
                                   atol=1e-5, rtol=0)
        mask = record.key_mask.expand_as(record.weights).any(1).any(1)  # (N, K)
        assert torch.equal(mask, enc["attention_mask"].bool()[example])


def test_two_returned_sequences_per_source_follow_their_own_beams(models):
    """The returned pairs of a source are different hypotheses: their aligned step rows
    are the eager rows of their own slots, and differ from each other somewhere."""
    cap, aligned, path, truth, _ = _aligned_and_truth(models, 2)
    live = path >= 0
    assert (path[0::2] != path[1::2]).any(), "both sequences took the same slots"
    for site, eager_steps in _eager_steps(cap, truth).items():
        gathered = _pad_cat([eager_steps[t][path[:, t].clamp_min(0), :, -1:]
                             for t in range(path.shape[1])])
        got = aligned[site].weights
        width = max(got.shape[-1], gathered.shape[-1])
        got = torch.nn.functional.pad(got, (0, width - got.shape[-1]))
        gathered = torch.nn.functional.pad(gathered, (0, width - gathered.shape[-1]))
        torch.testing.assert_close(got.masked_fill(~live[:, None, :, None], 0).float(),
                                   gathered.masked_fill(~live[:, None, :, None], 0).float(),
                                   atol=1e-5, rtol=0)
