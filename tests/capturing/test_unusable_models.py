"""Models capture cannot read are named plainly: a model on the meta device is captured
shape-only and refused by edits and analysers with a clear error; a model whose attention
runs inside TorchScript submodules is told so by NoAttentionFound."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import attnaudit
from attnaudit.analysis import EntropyAnalyser


class Attend(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.query = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.query(x) @ x.transpose(1, 2), -1) @ x


class Wrapper(nn.Module):
    def __init__(self, decoder: nn.Module) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 4)
        self.decoder = decoder

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.embed(x))


def uniform(site, weights, key_mask):
    eligible = key_mask.expand_as(weights).to(weights.dtype)
    return eligible / eligible.sum(-1, keepdim=True)


def meta_mha() -> nn.MultiheadAttention:
    with torch.device("meta"):
        return nn.MultiheadAttention(8, 2, batch_first=True)


def test_meta_model_is_captured_shape_only():
    model, x = meta_mha(), torch.empty(1, 3, 8, device="meta")
    with attnaudit.capture(model) as cap:
        model(x, x, x)
    [record] = cap.records.values()
    assert record.weights.is_meta and tuple(record.weights.shape) == (1, 2, 3, 3)


def test_meta_model_with_separate_keys_is_captured_shape_only():
    # distinct key tensors: whether they are the queries' own data cannot be read on meta,
    # so only the same tensor counts as self-attention
    model, x = meta_mha(), torch.empty(2, 3, 8, device="meta")
    for keys, kind, shape in ((torch.empty(2, 5, 8, device="meta"), "cross", (2, 2, 3, 5)),
                              (torch.empty(2, 3, 8, device="meta"), "cross", (2, 2, 3, 3)),
                              (x, "self", (2, 2, 3, 3))):
        with attnaudit.capture(model) as cap:
            model(x, keys, keys)
        [record] = cap.records.values()
        assert record.weights.is_meta and tuple(record.weights.shape) == shape
        assert record.kind == kind


def test_an_edit_on_a_meta_model_is_a_clear_error():
    model, x = meta_mha(), torch.empty(1, 3, 8, device="meta")
    with pytest.raises(attnaudit.EditError, match="meta device, which holds shapes"), \
            attnaudit.capture(model, edit=uniform):
        model(x, x, x)


def test_an_edit_returning_a_meta_tensor_is_a_clear_error():
    model, x = nn.MultiheadAttention(8, 2, batch_first=True), torch.randn(1, 3, 8)
    with pytest.raises(attnaudit.EditError, match="returned a tensor on the meta device"), \
            attnaudit.capture(model, edit=lambda s, w, k: torch.empty_like(w, device="meta")):
        model(x, x, x)


def test_analysing_a_meta_record_is_a_clear_error():
    model, x = meta_mha(), torch.empty(1, 3, 8, device="meta")
    with attnaudit.capture(model) as cap:
        model(x, x, x)
    with pytest.raises(ValueError, match="meta device, which holds shapes but no data"):
        EntropyAnalyser().update(next(iter(cap.records.values())))


def test_no_attention_found_names_the_traced_submodules():
    x = torch.randn(1, 3, 4)
    model = Wrapper(torch.jit.trace(Attend().eval(), x))
    with pytest.raises(attnaudit.NoAttentionFound) as caught, attnaudit.capture(model):
        model(x)
    message = str(caught.value)
    assert "1 submodule(s) are TorchScript" in message and ": decoder;" in message
    untraced = Wrapper(Attend())
    with attnaudit.capture(untraced) as cap:
        untraced(x)
    assert cap.sites == ["decoder"]
