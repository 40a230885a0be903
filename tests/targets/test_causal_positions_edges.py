"""Position ids of a causal LM whose generate() has no ``_prepare_position_ids_for_generation``
(older Hugging Face releases, custom generation code): the target counts them itself
(``attnaudit.targets.hf.causal._positions``). On left-padded prompts they are a hand count
(0 on padding, then 0, 1, 2... over the real tokens and the continuation), and the
teacher-forced logits are GPT-2's own forward given those ids, written out here.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import attnaudit

transformers = pytest.importorskip("transformers")

from tests.helpers.tiny_hf import VOCAB, save_checkpoint  # noqa: E402

PROMPTS = ["w5 w6 w7 w8", "w10", "w12 w13"]
EMITTED = torch.tensor([[20, 21, 22], [23, 24, 25], [26, 27, 28]])


def test_position_ids_counted_by_the_target_are_a_hand_count(tmp_path):
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2,
                                     n_head=4, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    save_checkpoint(transformers.GPT2LMHeadModel, config, tmp_path, eos_after=False)
    model = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    model._prepare_position_ids_for_generation = None  # as where generate() has none
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    target: Any = attnaudit.from_hf(model, PROMPTS, tokenizer=tokenizer, max_new_tokens=3)
    batch = next(target.iter_batches())
    real = [len(p.split()) for p in PROMPTS]
    width = batch.source_ids.shape[1]
    assert width == max(real) and not batch.source_mask.all()  # left-padded
    hand = torch.tensor([[0] * (width - n) + list(range(n + EMITTED.shape[1] - 1))
                         for n in real])
    inputs = target.sequence(batch, EMITTED)
    assert torch.equal(inputs["position_ids"], hand)
    with torch.no_grad():
        logits = target.teacher_forced(batch, EMITTED)
        ids = torch.cat([batch.source_ids, EMITTED[:, :-1]], 1)
        mask = torch.cat([batch.source_mask.long(), torch.ones_like(EMITTED[:, :-1])], 1)
        own = model(input_ids=ids, attention_mask=mask, position_ids=hand).logits
    torch.testing.assert_close(logits, own[:, -EMITTED.shape[1]:], atol=1e-5, rtol=0)
