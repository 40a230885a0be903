"""Which row the cached-decoding finding names, where the first batch does not hold it.

- A later batch holds the largest row: three prompts, one per batch, ordered so the last
  one's cached steps differ most from its one pass. Ground truth: the eager model's own
  ``generate(output_logits=True)`` against its forward over prompt + continuation, the
  total variation per step computed here by hand (as in ``test_cached_decoding.py``).
- Rows after an end-of-sequence never compete: a real target (Llama, whose cached steps
  agree with its one pass) whose cached decoding is made to disagree wildly after a row's
  end-of-sequence step and moderately at one counted row; the row named is the counted
  one, the counts are a hand count of the rows up to each first end-of-sequence step, and
  the total variation is computed here with numpy.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import attnaudit
from attnaudit.analysis.cached_decoding import compare_cached_decoding
from attnaudit.validity.pipeline import run_validity_audit

transformers = pytest.importorskip("transformers")

from tests.helpers.tiny_causal import tiny_causal_checkpoint  # noqa: E402

# one length: no padding, so the eager model's own calls need no mask
PROMPTS = ["w10 w11 w12 w13 w14 w15 w16 w17", "w20 w21 w22 w23 w24 w25 w26 w27",
           "w40 w41 w42 w43 w44 w45 w46 w47"]
NEW_TOKENS = 5
TOL = 1e-4


def _counted_eager_gap(folder: Path, prompts: list[str]) -> torch.Tensor:
    """(B, T) total variation between the eager model's generate() steps and its one pass;
    -1 after the first end-of-sequence step (rows that are not counted)."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, attn_implementation="eager").eval()
    ids = tokenizer(prompts, return_tensors="pt")["input_ids"]
    eos = model.config.eos_token_id
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             do_sample=False, num_beams=1, max_new_tokens=NEW_TOKENS,
                             output_logits=True, return_dict_in_generate=True,
                             eos_token_id=eos, pad_token_id=eos)
        steps = torch.stack(out.logits, 1).double()
        one_pass = model(input_ids=out.sequences[:, :-1]).logits[:, ids.shape[1] - 1:].double()
    gap = 0.5 * (steps.softmax(-1) - one_pass.softmax(-1)).abs().sum(-1)
    is_eos = (out.sequences[:, ids.shape[1]:] == eos).long()
    return gap.masked_fill((is_eos.cumsum(-1) - is_eos) > 0, -1.0)


def test_a_later_batch_holding_the_largest_row_is_the_one_named(tmp_path):
    folder = tiny_causal_checkpoint("deepseek_v32", tmp_path / "deepseek_v32")[0]
    gap = _counted_eager_gap(folder, PROMPTS)
    largest = gap.max(-1).values
    assert len(set(largest.tolist())) == len(PROMPTS), "tied prompts: the test is idle"
    order = largest.argsort().tolist()  # the prompt whose cached steps differ most: last
    ordered = [PROMPTS[i] for i in order]
    worst = gap[order[-1]]
    target = attnaudit.from_hf(folder, ordered, max_new_tokens=NEW_TOKENS, decoding="greedy",
                               batch_size=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = run_validity_audit(target, progress=False).cached_decoding
    assert found.measured
    assert (found.example, found.step) == (len(PROMPTS) - 1, int(worst.argmax()))
    assert abs(found.total_variation - float(worst.max())) <= TOL
    assert found.rows == int((gap >= 0).sum())


def _total_variation(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    def softmax(x: np.ndarray) -> np.ndarray:
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    return 0.5 * np.abs(softmax(a) - softmax(b)).sum(-1)


def test_rows_after_an_end_of_sequence_never_compete_with_counted_ones(tmp_path):
    folder = tiny_causal_checkpoint("llama", tmp_path / "llama")[0]
    target = attnaudit.from_hf(folder, PROMPTS[:2], max_new_tokens=NEW_TOKENS,
                               decoding="greedy")
    batch = next(target.iter_batches())
    eos = target.eos_id
    emitted = torch.tensor([[31, 7, 19, 44, 23], [5, 52, 8, 61, 12]])
    emitted[emitted == eos] = eos + 1
    emitted[0, 1] = eos  # row 0 ends at step 1: its steps 2.. are not counted
    hand = torch.tensor([[True, True, False, False, False], [True] * 5])
    steps = target.step_mask(emitted)
    assert torch.equal(steps, hand)
    decode = target.cached_decode
    assert decode is not None

    def disagreeing(b, e):  # called on chunks of the batch: rows found by their prompt
        logits = decode(b, e).clone()
        for row, text in enumerate(b.texts):
            if text == PROMPTS[0]:
                logits[row, 2:, logits.shape[-1] // 2] += 1e4  # after its end: one token
            else:
                logits[row, 3, 3] += 4.0  # a counted row, moderately off
        return logits

    changed = target.with_options(cached_decode=disagreeing)
    with torch.no_grad():
        logits = target.teacher_forced(batch, emitted)
        cached = disagreeing(batch, emitted).double().numpy()
    forced = logits.double().numpy()
    # the audit's own teacher-forced logits given, as the validity audit gives them: both
    # rows go in one chunk, so the cached decoding runs past row 0's end (row 1 goes on)
    found = compare_cached_decoding(changed, batch, emitted, steps, 5, forced=logits)
    tv = _total_variation(cached, forced)
    assert tv[0, 2:].min() > 0.9 > 4 * tv[1, 3]  # the ended rows would win if they competed
    assert tv[hand.numpy()].argmax() == int(hand[0].sum()) + 3  # row 1, step 3 (flat)
    assert (found.example, found.step) == (5 + 1, 3)
    assert found.rows == int(hand.sum()) == 7
    assert abs(found.total_variation - float(tv[1, 3])) <= TOL
    assert found.differing_rows == int((tv[hand.numpy()] > found.tolerance).sum()) >= 1
