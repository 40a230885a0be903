"""Multi-query attention (one key/value head broadcast over the query heads inside
``F.scaled_dot_product_attention``) captured with its values: the weights equal the
model's own eager ``output_attentions`` and ``weights @ values``, heads merged, equals what
the model feeds its output projection (Falcon, GPT-BigCode)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import attnaudit

transformers = pytest.importorskip("transformers")
B, T, H = 2, 7, 4


def build(name: str, backend: str) -> tuple[nn.Module, str]:
    torch.manual_seed(0)
    if name == "falcon":
        config = transformers.FalconConfig(
            vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=H,
            multi_query=True, new_decoder_architecture=False, bos_token_id=1, eos_token_id=2,
            attn_implementation=backend)
        return transformers.FalconForCausalLM(config).eval(), "transformer.h.0.self_attention"
    config = transformers.GPTBigCodeConfig(
        vocab_size=50, n_embd=16, n_layer=1, n_head=H, multi_query=True, n_positions=32,
        bos_token_id=1, eos_token_id=2, attn_implementation=backend)
    return transformers.GPTBigCodeForCausalLM(config).eval(), "transformer.h.0.attn"


@pytest.mark.parametrize("name", ["falcon", "gpt_bigcode"])
def test_multi_query_values_are_captured_per_query_head(name):
    model, path = build(name, "sdpa")
    truth_model, _ = build(name, "eager")
    module = model.get_submodule(path)
    projection = module.dense if name == "falcon" else module.c_proj
    seen: list[torch.Tensor] = []
    hook = projection.register_forward_pre_hook(lambda _, args: seen.append(args[0]))
    torch.manual_seed(1)
    ids = torch.randint(3, 50, (B, T))
    try:
        with torch.no_grad():
            truth = truth_model(input_ids=ids, output_attentions=True).attentions[0]
            with attnaudit.capture(model, values=True) as cap:
                model(input_ids=ids)
    finally:
        hook.remove()
    rec = cap.records[f"{path}:self"]
    torch.testing.assert_close(rec.weights, truth, rtol=0, atol=1e-5)
    assert rec.values.shape[:3] == (B, H, T)
    read = (rec.weights @ rec.values).transpose(1, 2).reshape(B, T, -1)
    torch.testing.assert_close(read, seen[0], rtol=0, atol=1e-5)
