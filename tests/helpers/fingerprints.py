"""What the audit promises to leave alone in a model, taken before and compared after."""

from __future__ import annotations

import torch


def model_fingerprint(model: torch.nn.Module) -> dict:
    """Everything capture promises to leave alone: parameters (bitwise), modes, flags, hooks."""
    return {
        "params": {n: p.detach().clone() for n, p in model.named_parameters()},
        "requires_grad": {n: p.requires_grad for n, p in model.named_parameters()},
        "training": {n: m.training for n, m in model.named_modules()},
        "hooks": {n: (len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks))
                  for n, m in model.named_modules()},
    }


def assert_unchanged(model: torch.nn.Module, before: dict) -> None:
    after = model_fingerprint(model)
    assert after["requires_grad"] == before["requires_grad"]
    assert after["training"] == before["training"]
    assert after["hooks"] == before["hooks"]
    for name, value in before["params"].items():
        assert torch.equal(after["params"][name], value), name
