"""Sequence effects' unedited columns, on a model whose outputs have different lengths.

A tiny random BART whose end-of-sequence logit is raised (``final_logits_bias``) so that,
greedy with at most 8 new tokens, its sources end after 8, 1, 1, 5 and 8 tokens (the two
that end at once have no row to edit). ``length``
(the unedited output's tokens, up to and including its end of sequence) is a hand count
over ``model.generate`` called here on each source alone; the uniform edit's
``edited_length`` is the same count over a decoding by hand under a capture whose edit
gives each cross-attention row ``1 / n_valid`` on the eligible source keys, 0 on the rest.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import attnaudit
from attnaudit.interventions.reference_run import reference
from attnaudit.interventions.sequence import sequence_effects

transformers = pytest.importorskip("transformers")

from tests.helpers.tiny_hf import save_checkpoint, tiny_config  # noqa: E402

SOURCES = ["w5 w9 w12 w7 w30 w8", "w11 w14", "w20 w21 w6 w33", "w40 w41 w42",
           "w50 w51 w52 w53 w54"]
NEW_TOKENS = 8
EOS_BIAS = 2.8  # between 2.7 and 2.8 the lengths stay 8, 1, 1, 5, 8 (away from a tipping point)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("bart_lengths")
    cls = transformers.BartForConditionalGeneration
    save_checkpoint(cls, tiny_config(transformers.BartConfig), folder)
    model = cls.from_pretrained(folder).eval()
    model.final_logits_bias[0, model.config.eos_token_id] = EOS_BIAS
    model.save_pretrained(folder)
    return folder


def _by_hand(model, batch, e: int, edit=None) -> list[int]:
    """Example ``e`` decoded alone with model.generate (greedy), up to its first EOS."""
    context = attnaudit.capture(model, edit=edit, sites=lambda n: n.endswith(":cross")) \
        if edit else torch.no_grad()
    with torch.no_grad(), context:
        out = model.generate(input_ids=batch.source_ids[e:e + 1],
                             attention_mask=batch.source_mask[e:e + 1].long(), num_beams=1,
                             do_sample=False, max_new_tokens=NEW_TOKENS)[0, 1:].tolist()
    eos = model.config.eos_token_id
    return out[: out.index(eos) + 1] if eos in out else out


def test_lengths_are_the_unedited_and_edited_outputs_token_counts(folder):
    target = attnaudit.from_hf(folder, SOURCES, max_new_tokens=NEW_TOKENS, decoding="greedy")
    batch = next(target.iter_batches())
    ref = reference(target, batch)
    table = sequence_effects(target, ref, ref.rows())

    model = transformers.BartForConditionalGeneration.from_pretrained(folder).eval()
    unedited = [_by_hand(model, batch, e) for e in range(len(SOURCES))]
    lengths = [len(out) for out in unedited]
    assert len(set(lengths)) >= 3, f"the outputs' lengths {lengths} hardly differ: idle"
    for protocol, rows in table.groupby("protocol"):
        assert list(rows["length"]) == [lengths[e] for e in rows["example"]], protocol
        assert (rows["edit_distance"] >= (rows["length"] - rows["edited_length"]).abs()).all()

    special = torch.tensor(target.special_ids)
    eligible = batch.source_mask & ~torch.isin(batch.source_ids, special)  # (B, n)

    def uniform(e: int):
        def edit(site, w, mask):  # 1 / n_valid on the eligible keys, 0 on the rest
            keep = eligible[e]
            new = torch.zeros_like(w)
            new[..., keep] = 1.0 / int(keep.sum())
            return new
        return edit

    got = table[table["protocol"] == "uniform"].reset_index(drop=True)
    examples = list(got["example"])  # the sources that end at once have no row to edit
    assert examples == [e for e in range(len(SOURCES)) if lengths[e] > 1]
    assert len({lengths[e] for e in examples}) >= 2
    edited = [_by_hand(model, batch, e, uniform(e)) for e in examples]
    assert list(got["edited_length"]) == [len(out) for out in edited]
    assert list(got["exact_match"]) == [unedited[e] == out
                                        for e, out in zip(examples, edited, strict=True)]
    # the edit changes some output's length: the two columns are not one count twice
    assert any(len(out) != lengths[e] for e, out in zip(examples, edited, strict=True))
