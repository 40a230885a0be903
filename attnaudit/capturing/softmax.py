"""Adapter for attention written as ``softmax(scores)``: ``torch.softmax``, ``F.softmax``,
``Tensor.softmax`` — from a module's ``forward``, a plain method called by the user's own
decoding loop, or ``nn.MultiheadAttention``'s Python path (whose values, the function's
local ``v``, capture then holds too: :mod:`attnaudit.capturing.mha`).

Eligibility is read off the scores: keys whose score was filled with a masking value
(``-inf``, ``finfo.min``, ``-1e9``) are ineligible. A model that masks by filling 0, or masks
after the softmax, leaks mass onto keys it meant to exclude; only a declared mask (from the
audit target) can reveal that.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from functools import wraps
from types import FrameType
from typing import Any
from weakref import WeakKeyDictionary

import torch
import torch.nn.functional as F

from attnaudit.capturing.layout import Layout, eligible_from_scores
from attnaudit.capturing.protocol import ActiveCapture
from attnaudit.capturing.roles import sink_columns
from attnaudit.capturing.state import ACTIVE, patch_attr, patch_references, refuse_tracing
from attnaudit.record import Site

ORIGINAL_TORCH_SOFTMAX = torch.softmax
ORIGINAL_F_SOFTMAX = F.softmax
ORIGINAL_TENSOR_SOFTMAX = torch.Tensor.softmax
MHA_CODE = F.multi_head_attention_forward.__code__


def _legacy_dim(ndim: int) -> int:
    # F.softmax(x) without dim: the implicit choice PyTorch makes (and warns about).
    return 0 if ndim in (0, 1, 3) else 1


def _patched(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    @wraps(original)
    def softmax(*args: Any, **kwargs: Any) -> torch.Tensor:
        cap = ACTIVE.capture
        if cap is None or cap.busy:
            return original(*args, **kwargs)
        refuse_tracing()
        cap.busy = True
        try:
            out = original(*args, **kwargs)
            # the call above ran, so its input is there
            scores = args[0] if args else kwargs["input"] if "input" in kwargs else kwargs["self"]
            dim = args[1] if len(args) > 1 else kwargs.get("dim")
            if dim is None:
                dim = _legacy_dim(out.ndim)
            return on_softmax(cap, scores, out, dim, sys._getframe(1))
        finally:
            cap.busy = False

    return softmax


def on_softmax(cap: ActiveCapture, scores: torch.Tensor, out: torch.Tensor, dim: int,
               frame: FrameType) -> torch.Tensor:
    """Record ``out = softmax(scores, dim)`` computed in ``frame``; what the model uses."""
    # F.multi_head_attention_forward (from nn.MultiheadAttention or called directly) works on
    # (batch * heads, queries, keys); its own num_heads / bsz arguments give the layout.
    in_mha = frame.f_code is MHA_CODE
    site = cap.mha_stack[-1].site if in_mha and cap.mha_stack else \
        cap.sites_registry.from_frame(frame, "softmax")
    if site is None:
        return out
    names = _Names(cap, frame, site)
    weights, sink = out, None
    n_sinks = _sinks(cap, site, tuple(out.shape), dim, names) if out.ndim else 0
    if n_sinks:  # trailing columns that are no keys (roles.sink_columns)
        n_keys = out.shape[dim] - n_sinks
        weights, sink = out.narrow(dim, 0, n_keys), out.narrow(dim, n_keys, n_sinks)
        scores = scores.narrow(dim, 0, n_keys)
    layout = cap.layout(site, tuple(weights.shape), dim, names, from_call=in_mha)
    scores4 = layout.to_record(scores)
    sink4 = None if sink is None else layout.to_record(sink.sum(dim, keepdim=True))
    values = _mha_values(cap, frame, layout) if in_mha and cap.mha_stack and not n_sinks \
        else None
    edited = cap.record(site, layout, layout.to_record(weights),
                        lambda: eligible_from_scores(scores4), scores4, values, sink4)
    if edited is None:
        return out
    new = layout.from_record(edited)
    return new if sink is None else torch.cat([new, sink], dim)


def _mha_values(cap: ActiveCapture, frame: FrameType, layout: Layout
                ) -> Callable[[], torch.Tensor]:
    """The values of the ``F.multi_head_attention_forward`` call in ``frame``, whose softmax
    the capture records: its local ``v`` (batch * heads, keys, d_v), final by then (biases and
    zero attention appended), as ``(B, H, K, d_v)`` on demand. With a value edit, the call's
    layout and ``v`` go to its :class:`~attnaudit.capturing.protocol.MhaCall` for the
    ``torch.bmm(weights, v)`` that follows (:mod:`attnaudit.capturing.mha`)."""
    if cap.value_edit is not None:
        cap.mha_stack[-1].read = (layout, frame.f_locals["v"])
    return lambda: layout.values_to_record(frame.f_locals["v"])


class _Names:
    """The calling frames' locals up to the site's method, read once, on first need."""

    def __init__(self, cap: ActiveCapture, frame: FrameType, site: Site) -> None:
        self._read = lambda: cap.sites_registry.names_at(frame, site)
        self._names: Mapping[str, Any] | None = None

    def __call__(self) -> Mapping[str, Any]:
        if self._names is None:
            self._names = self._read()
        return self._names


# Sink columns per registry, site, shape and key axis: read off the call site once.
_SINK_COUNTS: WeakKeyDictionary[object, dict[tuple[str, tuple[int, ...], int], int]] = \
    WeakKeyDictionary()


def _sinks(cap: ActiveCapture, site: Site, shape: tuple[int, ...], dim: int,
           names: Callable[[], Mapping[str, Any]]) -> int:
    """How many trailing columns of a softmax of ``shape`` over ``dim`` are sinks."""
    known = _SINK_COUNTS.setdefault(cap.sites_registry, {})
    key = (site.name, shape, dim)
    if key not in known:
        module = cap.sites_registry.modules.get(site.module)
        last = dim % len(shape) == len(shape) - 1  # concatenated sinks end the key axis
        known[key] = sink_columns(names(), module, shape[dim],
                                  cap.sites_registry.sink_names) if last else 0
    return known[key]


def install(stack: ExitStack, namespaces: list[dict[str, Any]]) -> None:
    """Patch the three softmax entry points, and direct imports of them in ``namespaces``."""
    torch_softmax = _patched(ORIGINAL_TORCH_SOFTMAX)
    f_softmax = _patched(ORIGINAL_F_SOFTMAX)
    patch_attr(stack, torch, "softmax", torch_softmax)
    patch_attr(stack, F, "softmax", f_softmax)
    patch_attr(stack, torch.Tensor, "softmax", _patched(ORIGINAL_TENSOR_SOFTMAX))
    patch_references(stack, namespaces, {id(ORIGINAL_TORCH_SOFTMAX): torch_softmax,
                                         id(ORIGINAL_F_SOFTMAX): f_softmax})
