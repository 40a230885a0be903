"""Decoder-only models: capture equals the model's own eager ``output_attentions`` for a
GPT-2 and a Llama-architecture model (grouped-query heads) built from tiny configs,
left-padded as Hugging Face batches them, in a forward pass and in ``generate()``."""

from __future__ import annotations

import pytest
import torch

import attnaudit

transformers = pytest.importorskip("transformers")


def build(name: str, backend: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if name == "gpt2":
        config = transformers.GPT2Config(vocab_size=50, n_positions=32, n_embd=32, n_layer=2,
                                         n_head=4, bos_token_id=1, eos_token_id=2,
                                         attn_implementation=backend)
        return transformers.GPT2LMHeadModel(config).eval()
    config = transformers.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=32,
                                      bos_token_id=1, eos_token_id=2,
                                      attn_implementation=backend)
    return transformers.LlamaForCausalLM(config).eval()


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    ids = torch.randint(3, 50, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :2] = 0  # left padding
    return ids, mask


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_causal_lm_capture_equals_eager_output_attentions(name):
    model, truth_model = build(name, "sdpa"), build(name, "eager")
    ids, mask = inputs()
    real = mask.bool()
    with torch.no_grad():
        truth = truth_model(input_ids=ids, attention_mask=mask, output_attentions=True)
        with attnaudit.capture(model) as cap:
            model(input_ids=ids, attention_mask=mask)
        generated = truth_model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=3,
                                         do_sample=False, pad_token_id=0,
                                         output_attentions=True, return_dict_in_generate=True)
        with attnaudit.capture(model) as steps:
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=3,
                                 do_sample=False, pad_token_id=0)
    assert len(cap.records) == 2 and all(r.kind == "self" for r in cap.records.values())
    counted = real[:, None, :, None] & real[:, None, None, :]  # real query rows and keys
    for rec, expected in zip(cap.records.values(), truth.attentions, strict=True):
        assert rec.weights.shape == expected.shape == (2, 4, 7, 7)
        assert ((rec.weights - expected).abs() * counted).max().item() <= 1e-5
    assert torch.equal(out, generated.sequences)
    for layer, rec in enumerate(steps.records.values()):
        for step in range(1, 3):  # the cached one-token steps
            expected = generated.attentions[step][layer]
            got = rec.calls[step].weights
            assert got.shape == expected.shape == (2, 4, 1, 7 + step)
            assert (got - expected)[1, :, :, 2:].abs().max().item() <= 1e-5
            assert (got - expected)[0].abs().max().item() <= 1e-5
