"""A causal LM that must be given token ids (DeepSeek-V4 routes experts by a fixed token ->
expert table) runs on ids: its teacher-forced logits equal the model's own ids forward
over prompt + prefix, its target declares no embedding, gradient attribution says it
cannot run instead of attributing embeddings the model never read, and leave-one-out
(which edits ids) equals a hand-made replaced prompt."""

from __future__ import annotations

import warnings

import pytest
import torch

from attnaudit.attribution.loo import leave_one_out
from attnaudit.attribution.methods import attribute
from attnaudit.errors import InterventionError
from attnaudit.targets.hf.loading import from_hf

transformers = pytest.importorskip("transformers")


from tests.helpers.tiny_causal import tiny_causal_checkpoint  # noqa: E402

PROMPTS = ["w5 w6 w7 w8 w9", "w10 w11"]


@pytest.fixture(scope="module")
def hash_routed(tmp_path_factory):
    folder, tokenizer = tiny_causal_checkpoint("deepseek_v4",
                                               tmp_path_factory.mktemp("deepseek_v4"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        target = from_hf(folder, PROMPTS, tokenizer=tokenizer, max_new_tokens=3)
    assert "hash_moe" in target.model.config.mlp_layer_types
    return target


def test_a_hash_routed_model_is_teacher_forced_on_its_ids(hash_routed):
    target = hash_routed
    batch = next(target.iter_batches())
    emitted = target.greedy(batch)
    with torch.no_grad():
        found = target.teacher_forced(batch, emitted)
        ids = torch.cat([batch.source_ids, emitted[:, :-1]], dim=1)
        mask = torch.cat([batch.source_mask.long(), torch.ones_like(emitted[:, :-1])], dim=1)
        positions = (mask.cumsum(-1) - 1).clamp_min(0)
        by_hand = target.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                               use_cache=False).logits[:, batch.source_ids.shape[1] - 1 :]
    torch.testing.assert_close(found, by_hand, atol=1e-5, rtol=0)
    assert target.source_embedding is None and target.target_embedding is None
    with pytest.raises(InterventionError, match="declares no source_embedding"):
        attribute(target, batch, emitted, ("input_x_gradient",), detach_attention=())
    # leave-one-out of the first prompt's last token, replaced by an ordinary id, by hand
    key, other = batch.source_ids.shape[1] - 1, 7
    with torch.no_grad():
        scores = leave_one_out(target, batch, emitted, replace_with=other)
        edited = batch.source_ids.clone()
        edited[0, key] = other
        ids = torch.cat([edited, emitted[:, :-1]], dim=1)
        moved = target.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                             use_cache=False).logits[:, batch.source_ids.shape[1] - 1 :]
    tvd = 0.5 * (moved[0].softmax(-1) - by_hand[0].softmax(-1)).abs().sum(-1)
    steps = target.step_mask(emitted)[0]
    torch.testing.assert_close(scores[0, steps, key], tvd[steps].to(scores.dtype),
                               atol=1e-5, rtol=0)
    assert tvd[steps].max() > 1e-4
