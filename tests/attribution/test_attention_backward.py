"""Gradient passes run short CPU attention calls on PyTorch's math backend: the choice
follows the key length against the head width, the graph holds no fused-kernel node where it
applies, and the gradients equal those of the default kernel (computed by plain autograd
through the model, outside attnaudit) on a tiny Llama."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from attnaudit.attribution.attention_backward import (
    MATH_KEYS_PER_WIDTH,
    runs_on_math,
    small_attention_on_math,
)
from attnaudit.attribution.inputs import EmbeddingPasses, embedded_inputs


def _graph_names(tensor: torch.Tensor) -> set[str]:
    names, todo, seen = set(), [tensor.grad_fn], set()
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        names.add(type(node).__name__)
        todo.extend(next_fn for next_fn, _ in node.next_functions)
    return names


def _fused(names: set[str]) -> bool:
    return any("ScaledDotProduct" in name for name in names)


@pytest.mark.parametrize("keys", [MATH_KEYS_PER_WIDTH * 8, MATH_KEYS_PER_WIDTH * 8 + 1])
def test_the_key_length_against_the_head_width_picks_the_kernel(keys: int) -> None:
    gen = torch.Generator().manual_seed(0)
    query = torch.randn(2, 3, 5, 8, generator=gen, requires_grad=True)
    key, value = torch.randn(2, 2, 3, keys, 8, generator=gen).unbind(0)
    math = keys <= MATH_KEYS_PER_WIDTH * 8
    assert runs_on_math(query, key, value) is math
    with small_attention_on_math():
        out = F.scaled_dot_product_attention(query, key, value)
    assert _fused(_graph_names(out)) is not math
    (got,) = torch.autograd.grad(out.sum(), query)
    (default,) = torch.autograd.grad(F.scaled_dot_product_attention(query, key, value).sum(), query)
    torch.testing.assert_close(got, default, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        assert not runs_on_math(query, key, value)
    assert not runs_on_math(query.detach(), key, value)


transformers = pytest.importorskip("transformers")


def test_a_saliency_pass_runs_on_math_and_keeps_the_models_gradients(tmp_path: Path) -> None:
    from attnaudit.targets.hf.loading import from_hf
    from tests.helpers.tiny_hf import VOCAB, save_checkpoint

    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        initializer_range=0.3,
        attn_implementation="sdpa",
    )
    save_checkpoint(transformers.LlamaForCausalLM, config, tmp_path, eos_after=False)
    model = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    target = from_hf(
        model, ["w5 w6 w7 w8 w9", "w10 w11 w12 w13"], tokenizer=tokenizer, max_new_tokens=3
    )
    batch = next(target.iter_batches())
    emitted = target.greedy(batch)
    passes = EmbeddingPasses(target, batch, "prob", target_side=False)
    inputs = embedded_inputs(passes, emitted, None, 0, eos_kept=False)
    rows = torch.arange(len(batch))
    with torch.enable_grad():
        leaf = inputs.source.detach().requires_grad_()
        values, _, _ = passes.outputs(rows, emitted, None, leaf)
    assert not _fused(_graph_names(values))  # 8 keys at most, heads 8 wide: math
    got = [grads[0] for _, grads in passes.gradients(rows, inputs, inputs.source, None, False)]

    # by hand: the prompt and the emitted prefix as inputs_embeds, the default kernel
    ids = torch.cat([batch.source_ids, emitted[:, :-1]], 1)
    mask = torch.cat([batch.source_mask, torch.ones_like(emitted[:, :-1], dtype=torch.bool)], 1)
    positions = (mask.long().cumsum(-1) - 1).clamp_min(0)
    prompt = batch.source_ids.shape[1]
    with torch.enable_grad():
        embedded = model.get_input_embeddings()(batch.source_ids).detach().requires_grad_()
        rest = model.get_input_embeddings()(ids[:, prompt:])
        logits = model(
            inputs_embeds=torch.cat([embedded, rest], 1),
            attention_mask=mask.long(),
            position_ids=positions,
        ).logits
        probs = logits[:, prompt - 1 :].softmax(-1).gather(-1, emitted[..., None])[..., 0]
        assert _fused(_graph_names(probs))
        for step, grad in enumerate(got):
            (truth,) = torch.autograd.grad(probs[:, step].sum(), embedded, retain_graph=True)
            torch.testing.assert_close(grad, truth, rtol=1e-4, atol=1e-6)
