"""An output projection read as the affine map it is: a plain ``nn.Linear`` by its
parameters, anything else (a hooked Linear, a subclass with its own forward, a ``x W + b``
module) by what it computes, each checked against the module's own outputs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnaudit.contributions.projection import affine_map


class _XWPlusB(nn.Module):
    """GPT-2's ``Conv1D`` layout: ``x W + b`` with W (d_in, d_out)."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d_in, d_out))
        self.bias = nn.Parameter(torch.randn(d_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight + self.bias


class _ScaledLinear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 3 * super().forward(x)


def _doubled(module: nn.Module, args: object, output: torch.Tensor) -> torch.Tensor:
    return 2 * output


def _hooked() -> nn.Module:
    module = nn.Linear(6, 4)
    module.register_forward_hook(_doubled)
    return module


@pytest.mark.parametrize(
    "make",
    [
        lambda: nn.Linear(6, 4),
        lambda: nn.Linear(6, 4, bias=False),
        _hooked,
        lambda: _ScaledLinear(6, 4),
        lambda: _XWPlusB(6, 4),
    ],
    ids=["linear", "linear-no-bias", "hooked", "subclass", "x-w-plus-b"],
)
def test_the_map_reproduces_the_module(make) -> None:
    torch.manual_seed(0)
    module = make()
    x = torch.randn(5, 6)
    weight, bias = affine_map(module, 6)
    assert weight.shape == (6, 4) and bias.shape == (4,)
    assert weight.dtype == bias.dtype == torch.float32
    with torch.no_grad():
        torch.testing.assert_close(x @ weight + bias, module(x), rtol=1e-5, atol=1e-5)


def test_a_bfloat16_linear_gives_its_own_parameters_exactly() -> None:
    torch.manual_seed(1)
    module = nn.Linear(8, 3).to(torch.bfloat16)
    weight, bias = affine_map(module, 8)
    assert torch.equal(weight, module.weight.detach().t().float())
    assert torch.equal(bias, module.bias.detach().float())
