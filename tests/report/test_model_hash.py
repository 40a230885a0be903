"""The manifest's model hash: the recipe its docstring gives, computed here without attnaudit
(one line per state_dict entry with the sha256 of the tensor's bytes), on a model with tied
weights and on any number of hashing threads; and the plan's estimate of what it costs."""

from __future__ import annotations

import hashlib

import pytest
import torch
from torch import nn

from attnaudit.report import manifest
from attnaudit.report.manifest import hash_seconds, state_dict_sha256


class Tied(nn.Module):
    """An embedding whose matrix is also the output layer's (two state_dict entries, one
    tensor), a bfloat16 buffer and a non-contiguous parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.out = nn.Linear(16, 50, bias=False)
        self.out.weight = self.embed.weight
        self.register_buffer("scale", torch.linspace(0, 1, 7, dtype=torch.bfloat16))
        self.wide = nn.Parameter(torch.randn(16, 8).t())


def independent_hash(model: nn.Module) -> str:
    digest = hashlib.sha256()
    state = model.state_dict()
    for name in sorted(state):
        tensor = state[name].contiguous()
        data = hashlib.sha256(tensor.view(torch.uint8).numpy().tobytes()).hexdigest()
        digest.update(f"{name} {tensor.dtype} {tuple(tensor.shape)} {data}\n".encode())
    return digest.hexdigest()


@pytest.mark.parametrize("threads", [1, 3])
def test_the_hash_follows_its_recipe_with_tied_weights_on_any_thread_count(monkeypatch, threads):
    torch.manual_seed(0)
    model = Tied()
    monkeypatch.setattr(manifest, "HASH_THREADS", threads)
    assert state_dict_sha256(model) == independent_hash(model)
    before = state_dict_sha256(model)
    with torch.no_grad():
        model.out.weight[0, 0] += 1  # the tied matrix changes both entries
    assert state_dict_sha256(model) == independent_hash(model) != before


def test_the_estimate_counts_a_tied_tensor_once_and_shares_the_rest_between_threads(
        monkeypatch):
    torch.manual_seed(0)
    model = Tied()
    model.extra = nn.Linear(16, 16, bias=False)  # 256 more parameters in float32
    clock = iter(range(100))  # each reading one second after the last: a fixed rate
    monkeypatch.setattr(manifest.time, "perf_counter", lambda: float(next(clock)))
    monkeypatch.setattr(manifest, "HASH_SAMPLE_BYTES", 2**30)  # the sample: every tensor
    sizes = {"embed": 50 * 16 * 4, "scale": 7 * 2, "wide": 16 * 8 * 4, "extra": 16 * 16 * 4}
    total = sum(sizes.values())  # the tied matrix once
    monkeypatch.setattr(manifest, "HASH_THREADS", 1)
    assert hash_seconds(model) == pytest.approx(1.0)  # every byte on one thread
    monkeypatch.setattr(manifest, "HASH_THREADS", 2)
    # largest first onto the least busy thread: the embedding alone, the rest on the other
    assert hash_seconds(model) == pytest.approx(sizes["embed"] / total)
