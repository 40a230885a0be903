"""The output projection's backward pass restricted to the positions that reach the output.

A shared teacher-forced pass computes the logits of every step, ``(R, T, V)``, through the
model's output projection (``W``: ``V x d``); each step's backward pass then needs the
gradient at the hidden states of that step's position only, but autograd's backward of the
projection multiplies the whole ``(R, T, V)`` gradient, zeros included, by ``W``: ``T``
times the work, and at a vocabulary of 50,000 the largest matrix product of the pass.
While :func:`sparse_output_head` is active, the model's output projection (when it is a
plain ``nn.Linear``: ``model.get_output_embeddings()``) computes the same logits through
:class:`RowSparseLinear`, whose backward pass multiplies only the rows whose gradient is not
all zero. Its weight and bias are taken as constants (no gradient for the parameters), which
is what attribution needs; the module is restored on exit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class RowSparseLinear(torch.autograd.Function):
    """``F.linear(x, weight, bias)`` whose backward pass computes the gradient at ``x`` (.., d)
    for the rows whose output gradient (.., V) is not all zero, and 0 elsewhere; ``weight``
    and ``bias`` get no gradient."""

    @staticmethod
    def forward(x: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
        # as one 2-D product: a strided 3-D ``x`` (the last positions' slice of a model
        # that keeps only their logits) that requires grad, against a weight that does not,
        # makes ``torch.matmul`` copy the expanded weight for a batched product (at a
        # vocabulary of 128,256, seconds per pass)
        flat = F.linear(x.reshape(-1, x.shape[-1]), weight, bias)
        return flat.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        x, weight, _ = inputs
        ctx.save_for_backward(weight)
        ctx.x_shape = x.shape

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (weight,) = ctx.saved_tensors
        flat = grad.reshape(-1, grad.shape[-1])
        rows = (flat != 0).any(-1).nonzero().squeeze(1)
        out = flat.new_zeros(flat.shape[0], weight.shape[1])
        out[rows] = flat[rows] @ weight
        return out.reshape(ctx.x_shape), None, None


def _head(model: nn.Module) -> nn.Linear | None:
    """The model's output projection when it is a plain ``nn.Linear`` (not a subclass, which
    may store its weight otherwise), else None."""
    getter = getattr(model, "get_output_embeddings", None)
    try:
        head = getter() if callable(getter) else None
    except (AttributeError, NotImplementedError):  # models that have no such head say so
        return None
    return head if type(head) is nn.Linear else None


@contextmanager
def sparse_output_head(model: nn.Module) -> Iterator[None]:
    """Within the block, ``model``'s output projection runs as :class:`RowSparseLinear`
    (module docstring); a model without a plain ``nn.Linear`` one runs unchanged."""
    head = _head(model)
    if head is None or "forward" in vars(head):
        yield
        return

    def forward(input: torch.Tensor) -> torch.Tensor:
        bias = None if head.bias is None else head.bias.detach()
        return RowSparseLinear.apply(input, head.weight.detach(), bias)

    head.forward = forward  # type: ignore[method-assign]
    try:
        yield
    finally:
        del head.forward
