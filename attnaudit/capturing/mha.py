"""Adapter for ``nn.MultiheadAttention`` (also inside ``nn.Transformer*`` layers).

``nn.TransformerEncoderLayer`` and friends call their attention with ``need_weights=False``,
and in eval mode under ``no_grad`` PyTorch's fast paths run fused C++ kernels that never
materialise weights. During capture the MHA fast path is switched off (restored on exit)
and a pre-hook asks each selected module for weights, so ``F.multi_head_attention_forward``
takes its Python path, whose softmax the softmax adapter records per head. A post-hook
hands the caller exactly what it asked for: ``(output, None)`` when it did not want weights.

The values are the Python path's own ``v`` (batch * heads, keys, d_v), read off its frame
at the softmax (:mod:`attnaudit.capturing.softmax`). With a value edit
(``capture(value_edit=)``) ``torch.bmm`` is routed through capture too, and the one product
of a selected call's weights with that ``v`` — the call's read — is the edit's read
instead; the output projection then maps it as it maps the model's own. Every other
``torch.bmm`` runs unchanged.
"""

from __future__ import annotations

import sys
from contextlib import ExitStack
from typing import Any

import torch
from torch import nn

from attnaudit.capturing.protocol import ActiveCapture, MhaCall
from attnaudit.capturing.softmax import MHA_CODE
from attnaudit.capturing.state import patch_attr

ORIGINAL_BMM = torch.bmm

_NEED_WEIGHTS_POS = 4  # forward(query, key, value, key_padding_mask, need_weights, ...)


def install(stack: ExitStack, cap: ActiveCapture, modules: list[nn.Module]) -> None:
    """Hook every ``nn.MultiheadAttention`` among ``modules`` until ``stack`` closes."""
    modules = [m for m in modules if isinstance(m, nn.MultiheadAttention)]
    if not modules:
        return
    previous = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    stack.callback(torch.backends.mha.set_fastpath_enabled, previous)
    for module in modules:
        stack.callback(module.register_forward_pre_hook(_pre_hook(cap), with_kwargs=True).remove)
        stack.callback(module.register_forward_hook(_post_hook(cap), with_kwargs=True,
                                                    always_call=True).remove)
    if cap.value_edit is not None:
        patch_attr(stack, torch, "bmm", _read(cap))


def _read(cap: ActiveCapture):
    """``torch.bmm`` that, for the product of a selected call's weights with its values
    ``v`` (:attr:`MhaCall.read`), returns the value edit's read: ``(B * H, Q, d_v)``."""

    def bmm(input: torch.Tensor, mat2: torch.Tensor, *args: Any, **kwargs: Any
            ) -> torch.Tensor:
        call = cap.mha_stack[-1] if cap.mha_stack and not cap.busy else None
        if call is None or call.read is None or mat2 is not call.read[1] or args or kwargs \
                or sys._getframe(1).f_code is not MHA_CODE:
            return ORIGINAL_BMM(input, mat2, *args, **kwargs)
        (layout, value), call.read = call.read, None
        read = cap.value_read(layout.to_record(input), layout.values_to_record(value))
        return ORIGINAL_BMM(input, mat2) if read is None else layout.read_from_record(read)

    return bmm


def _pre_hook(cap: ActiveCapture):
    def hook(module: nn.MultiheadAttention, args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        query = args[0] if args else kwargs.get("query")
        key = args[1] if len(args) > 1 else kwargs.get("key")
        site = cap.sites_registry.for_module(module, lambda: _kind(module, query, key), "mha")
        if site is None:
            return None
        if len(args) > _NEED_WEIGHTS_POS:
            asked = bool(args[_NEED_WEIGHTS_POS])
            args = (*args[:_NEED_WEIGHTS_POS], True, *args[_NEED_WEIGHTS_POS + 1:])
        else:
            asked = bool(kwargs.get("need_weights", True))
            kwargs = {**kwargs, "need_weights": True}
        cap.mha_stack.append(MhaCall(module, site, asked))
        return args, kwargs

    return hook


def _kind(module: nn.MultiheadAttention, query: Any, key: Any) -> str:
    """``self`` when the keys are the queries' own data — the same tensor, a separately
    permuted copy of it, or a cache whose last positions are the queries — else ``cross``.
    On the meta device (shapes, no data) only the same tensor is ``self``."""
    if query is key:
        return "self"
    if not isinstance(query, torch.Tensor) or not isinstance(key, torch.Tensor):
        return "cross"
    seq = 1 if module.batch_first and query.dim() == 3 else 0
    n = query.shape[seq]
    if key.shape[:seq] != query.shape[:seq] or key.shape[seq + 1:] != query.shape[seq + 1:] \
            or key.shape[seq] < n:
        return "cross"
    if query.is_meta or key.is_meta:  # shapes only, no data to compare: not the same tensor
        return "cross"
    return "self" if torch.equal(key.narrow(seq, key.shape[seq] - n, n), query) else "cross"


def _post_hook(cap: ActiveCapture):
    def hook(module: nn.MultiheadAttention, args: tuple[Any, ...], kwargs: dict[str, Any],
             output: Any) -> Any:
        if not cap.mha_stack or cap.mha_stack[-1].module is not module:
            return None
        asked = cap.mha_stack.pop().asked
        if output is not None and not asked:
            return output[0], None
        return None

    return hook
