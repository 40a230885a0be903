"""Adapter for ``F.scaled_dot_product_attention``.

Under capture a selected call is computed explicitly — scores, mask, softmax, dropout,
weighted read — so the weights exist and an edit can replace them before the read. The
explicit path follows PyTorch's semantics: a bool ``attn_mask`` is True where a key may be
attended, a float mask is added to the scores, ``is_causal`` is the top-left aligned lower
triangle, and a row with every key masked yields zero weights (as the fused kernels give
zero output), recorded as such. fp16/bf16 scores and softmax run in fp32.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from typing import Any

import torch
import torch.nn.functional as F

from attnaudit.capturing.layout import eligible_from_scores
from attnaudit.capturing.protocol import ActiveCapture
from attnaudit.capturing.softmax import ORIGINAL_TORCH_SOFTMAX
from attnaudit.capturing.state import ACTIVE, patch_attr, patch_references, refuse_tracing
from attnaudit.record import Site

ORIGINAL_SDPA = F.scaled_dot_product_attention


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> torch.Tensor:
    """Drop-in for ``F.scaled_dot_product_attention``; records weights, lets edits replace them."""
    cap = ACTIVE.capture
    if cap is None or cap.busy or (is_causal and attn_mask is not None):
        return ORIGINAL_SDPA(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                             is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    refuse_tracing()
    frame = sys._getframe(1)
    site = cap.sites_registry.from_frame(frame, "sdpa", kind_hint="self" if is_causal else None)
    if site is None:
        return ORIGINAL_SDPA(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                             is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    cap.busy = True
    try:
        return _explicit(cap, site, lambda: cap.sites_registry.names_at(frame, site), query,
                         key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    finally:
        cap.busy = False


def _explicit(cap: ActiveCapture, site: Site, names: Callable[[], Mapping[str, Any]],
              query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attn_mask: torch.Tensor | None,
              dropout_p: float, is_causal: bool, scale: float | None,
              enable_gqa: bool) -> torch.Tensor:
    """query (..., L, E), key (..., S, E), value (..., S, Ev) -> output (..., L, Ev).

    ``names``: the caller's locals, for a layout that folds heads into the batch."""
    n_q, n_k = query.shape[-2], key.shape[-2]
    if enable_gqa and query.ndim >= 3 and key.shape[-3] != query.shape[-3]:
        repeat = query.shape[-3] // key.shape[-3]
        key = key.repeat_interleave(repeat, dim=-3)
        value = value.repeat_interleave(repeat, dim=-3)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    compute = torch.float32 if query.dtype in (torch.float16, torch.bfloat16) else query.dtype
    scores = torch.matmul(query.to(compute), key.to(compute).transpose(-2, -1)).mul_(scale)
    allowed = None
    if is_causal:
        allowed = torch.ones(n_q, n_k, dtype=torch.bool, device=query.device).tril()
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            allowed = attn_mask
        else:
            scores = scores.add_(attn_mask.to(compute))
    if allowed is not None:
        scores = scores.masked_fill_(~allowed, float("-inf"))
    weights = ORIGINAL_TORCH_SOFTMAX(scores, dim=-1)
    # Rows with every key masked: softmax gives NaN, the fused kernels zero. Found on the
    # (small, head-broadcast) mask rather than on the scores. On CPU, looking first skips a
    # pass over the weights in the common case; on an accelerator looking would make the
    # host wait for the device at every call, so the fill runs regardless.
    if allowed is not None:
        dead = ~allowed.any(dim=-1, keepdim=True)
    elif attn_mask is not None:
        dead = torch.isneginf(attn_mask).all(dim=-1, keepdim=True)
    else:
        dead = None
    if dead is not None and (dead.device.type != "cpu" or bool(dead.any())):
        weights = weights.masked_fill(dead, 0.0)
    weights = weights.to(value.dtype)

    layout = cap.layout(site, tuple(weights.shape), -1, names, query_last=True)

    def eligibility() -> torch.Tensor:
        if allowed is not None:
            return layout.to_record(allowed)
        if attn_mask is not None:
            return layout.to_record(eligible_from_scores(attn_mask))
        return torch.ones(1, 1, 1, n_k, dtype=torch.bool, device=weights.device)

    values4 = layout.values_to_record(value) if cap.keep_values else None
    edited = cap.record(site, layout, layout.to_record(weights), eligibility,
                        layout.to_record(scores), values4)
    used = weights if edited is None else layout.from_record(edited)
    if dropout_p > 0.0:
        used = F.dropout(used, p=dropout_p, training=True)
    return torch.matmul(used, value)


def install(stack: ExitStack, namespaces: list[dict[str, Any]]) -> None:
    """Route ``F.scaled_dot_product_attention`` (and direct imports of it) through capture."""
    patch_attr(stack, F, "scaled_dot_product_attention", scaled_dot_product_attention)
    patch_references(stack, namespaces, {id(ORIGINAL_SDPA): scaled_dot_product_attention})
