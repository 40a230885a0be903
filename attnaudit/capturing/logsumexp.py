"""Adapter for attention written without a softmax call:
``exp(scores - logsumexp(scores, dim, keepdim=True))`` (Reformer's local and LSH attention).

While a capture is active, ``torch.logsumexp`` / ``Tensor.logsumexp`` called from the
model's code remember their input and result (one at a time: the last call). An
``exp`` (``torch.exp`` / ``Tensor.exp``) called next from the same frame on a tensor of the
same shape is that softmax when its argument is the scores less the log-sum-exp (checked on
the numbers, masked ``-inf`` entries included); it is then recorded and edited as the
softmax of those scores over that axis. Any other ``exp`` (a z-loss, a sink scaling that
reads the log-sum-exp) runs as it is, and nothing is recorded for it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from functools import wraps
from types import CodeType
from typing import Any

import torch

from attnaudit.capturing.softmax import on_softmax
from attnaudit.capturing.state import ACTIVE, patch_attr, patch_references, refuse_tracing

ORIGINAL_TORCH_LOGSUMEXP = torch.logsumexp
ORIGINAL_TENSOR_LOGSUMEXP = torch.Tensor.logsumexp
ORIGINAL_TORCH_EXP = torch.exp
ORIGINAL_TENSOR_EXP = torch.Tensor.exp


@dataclass
class _Pending:
    """The last log-sum-exp taken by the model's code, waiting for its ``exp``."""

    scores: torch.Tensor
    lse: torch.Tensor  # keepdim: broadcastable to scores
    dim: int
    code: CodeType
    frame_id: int


class _Slot:
    pending: _Pending | None = None


PENDING = _Slot()


def _lse(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    @wraps(original)
    def logsumexp(*args: Any, **kwargs: Any) -> torch.Tensor:
        out = original(*args, **kwargs)
        cap = ACTIVE.capture
        if cap is None or cap.busy:
            return out
        scores = args[0] if args else kwargs.get("input", kwargs.get("self"))
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
        if not isinstance(scores, torch.Tensor) or not isinstance(dim, int) or scores.ndim == 0:
            return out
        dim %= scores.ndim
        frame = sys._getframe(1)
        PENDING.pending = _Pending(scores, out if keepdim else out.unsqueeze(dim), dim,
                                   frame.f_code, id(frame))
        return out

    return logsumexp


def _exp(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    @wraps(original)
    def exp(*args: Any, **kwargs: Any) -> torch.Tensor:
        pending, cap = PENDING.pending, ACTIVE.capture
        if pending is None or cap is None or cap.busy:
            return original(*args, **kwargs)
        x = args[0] if args else kwargs.get("input", kwargs.get("self"))
        frame = sys._getframe(1)
        if (not isinstance(x, torch.Tensor) or x.shape != pending.scores.shape
                or frame.f_code is not pending.code or id(frame) != pending.frame_id):
            return original(*args, **kwargs)
        PENDING.pending = None
        out = original(*args, **kwargs)
        if not _is_normalised(x, pending):
            return out
        refuse_tracing()
        cap.busy = True
        try:
            return on_softmax(cap, pending.scores, out, pending.dim, frame)
        finally:
            cap.busy = False

    return exp


def _is_normalised(x: torch.Tensor, pending: _Pending) -> bool:
    """True when ``x`` is the pending scores less their log-sum-exp."""
    with torch.no_grad():
        rebuilt = (x + pending.lse).to(pending.scores.dtype)
        return bool(torch.allclose(rebuilt, pending.scores, rtol=1e-4, atol=1e-4))


def install(stack: ExitStack, namespaces: list[dict[str, Any]]) -> None:
    """Patch ``logsumexp`` and ``exp`` (functions, methods, direct imports in
    ``namespaces``); the pending log-sum-exp is dropped when ``stack`` closes."""
    torch_lse, torch_exp = _lse(ORIGINAL_TORCH_LOGSUMEXP), _exp(ORIGINAL_TORCH_EXP)
    patch_attr(stack, torch, "logsumexp", torch_lse)
    patch_attr(stack, torch, "exp", torch_exp)
    patch_attr(stack, torch.Tensor, "logsumexp", _lse(ORIGINAL_TENSOR_LOGSUMEXP))
    patch_attr(stack, torch.Tensor, "exp", _exp(ORIGINAL_TENSOR_EXP))
    patch_references(stack, namespaces, {id(ORIGINAL_TORCH_LOGSUMEXP): torch_lse,
                                         id(ORIGINAL_TORCH_EXP): torch_exp})
    stack.callback(setattr, PENDING, "pending", None)
