"""Decoder-only interventions at length: with a prompt many times longer than the
continuation, every edited item runs one cached position, and no attention capture computes
explicitly has more query rows than the continuation (the reference run) or the edited row
(an edited item) — nothing of prompt length squared beyond the model's own kernel. The
numbers equal those of re-running prompt and prefix (a Llama with grouped-query attention
and left-padded prompts)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnaudit.capturing.sdpa as sdpa_adapter
from attnaudit.interventions.ablation import uniform_test
from attnaudit.interventions.reference_run import reference

transformers = pytest.importorskip("transformers")

from tests.helpers.tiny_hf import VOCAB, save_checkpoint  # noqa: E402

PROMPT_WORDS, NEW_TOKENS = (90, 70), 3


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    from attnaudit.targets.hf.loading import from_hf

    folder = tmp_path_factory.mktemp("llama_long")
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.3,
        vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        attn_implementation="sdpa")
    save_checkpoint(transformers.LlamaForCausalLM, config, folder, eos_after=False)
    model = transformers.LlamaForCausalLM.from_pretrained(folder,
                                                          attn_implementation="sdpa").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    gen = torch.Generator().manual_seed(3)
    prompts = [" ".join(f"w{i}" for i in torch.randint(10, VOCAB - 1, (n,), generator=gen))
               for n in PROMPT_WORDS]
    return from_hf(model, prompts, tokenizer=tokenizer, max_new_tokens=NEW_TOKENS)


def test_an_edited_item_costs_one_cached_position(target, monkeypatch):
    explicit_rows: list[int] = []  # query rows of every softmax capture's SDPA path makes
    original = sdpa_adapter.ORIGINAL_TORCH_SOFTMAX

    def counted(scores, dim):
        explicit_rows.append(scores.shape[-2])
        return original(scores, dim=dim)

    monkeypatch.setattr(sdpa_adapter, "ORIGINAL_TORCH_SOFTMAX", counted)
    positions: list[int] = []  # positions each forward of the model runs
    hook = target.model.register_forward_pre_hook(
        lambda module, args, kwargs: positions.append(
            (kwargs.get("input_ids") if kwargs.get("input_ids") is not None
             else kwargs["inputs_embeds"]).shape[1]), with_kwargs=True)
    try:
        batch = next(target.iter_batches())
        prompt = batch.source_ids.shape[1]
        assert prompt >= max(PROMPT_WORDS) > 20 * NEW_TOKENS
        ref = reference(target, batch)
        steps = ref.emitted.shape[1]
        assert ref.states is not None and explicit_rows
        assert max(explicit_rows) <= steps  # the reference run: continuation rows only
        explicit_rows.clear()
        positions.clear()
        cached = uniform_test(target, ref)
        assert len(cached) > 0
        assert positions and set(positions) == {1}  # one position per edited forward
        # the edited row alone, over the prompt's keys (with its query heads as heads: the
        # padded batch makes Hugging Face pack grouped-query heads onto the query axis)
        assert set(explicit_rows) == {1}
    finally:
        hook.remove()
    rerun = uniform_test(target, reference(target, batch, incremental=False))
    np.testing.assert_allclose(cached["uniform_tvd"], rerun["uniform_tvd"], atol=1e-5)
