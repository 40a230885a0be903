"""Adapter for ``F.scaled_dot_product_attention``.

Under capture a selected call is computed explicitly — scores, mask, softmax, dropout,
weighted read — so the weights exist and an edit can replace them before the read, and the
values are at hand, so a value edit can replace the read itself (``capture(value_edit=)``). The
explicit path follows PyTorch's semantics: a bool ``attn_mask`` is True where a key may be
attended, a float mask is added to the scores, ``is_causal`` is the top-left aligned lower
triangle, and a row with every key masked yields zero weights (as the fused kernels give
zero output), recorded as such. fp16/bf16 scores and softmax run in fp32. A call larger
than the capture's memory budget is computed in query blocks, each recorded (and edited)
as its own call (:mod:`attnaudit.capturing.blocks`). Hugging Face's one-token
grouped-query step, which packs query heads onto the query axis, is recorded with its heads
as heads and its one query as the query.

On the first calls at each site (:data:`~attnaudit.capturing.parity.PARITY_CALLS_PER_SITE`)
the deployed kernel — whatever ``F.scaled_dot_product_attention`` was when the capture began —
also runs on the call's own arguments, and the gap between its output and the explicit one is
kept for the gate's backend-parity check (:mod:`attnaudit.capturing.parity`).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from types import FrameType
from typing import Any

import torch
import torch.nn.functional as F

from attnaudit.capturing import parity
from attnaudit.capturing.blocks import block_rows, query_blocks
from attnaudit.capturing.layout import Layout, eligible_from_scores
from attnaudit.capturing.protocol import ActiveCapture
from attnaudit.capturing.softmax import ORIGINAL_TORCH_SOFTMAX
from attnaudit.capturing.state import ACTIVE, patch_attr, patch_references, refuse_tracing
from attnaudit.record import Site

ORIGINAL_SDPA = F.scaled_dot_product_attention
# The function users' calls reach outside capture; set by install() for each capture.
DEPLOYED_SDPA = ORIGINAL_SDPA


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
    given = (query, key, value, attn_mask, enable_gqa)
    packed = query.shape if _packed_gqa(frame, query, key) else None
    if packed is not None:  # one query per head, as the model means it
        query = query.reshape(packed[0], packed[1] * packed[2], 1, packed[3])
        if attn_mask is not None and attn_mask.ndim == 4 and attn_mask.shape[1] != 1:
            attn_mask = attn_mask.reshape(packed[0], query.shape[1], 1, attn_mask.shape[-1])
        enable_gqa = True
    cap.busy = True
    try:
        out, edited = _explicit(cap, site, lambda: cap.sites_registry.names_at(frame, site),
                                query, key, value, attn_mask, dropout_p, is_causal, scale,
                                enable_gqa)
        out = out if packed is None else out.reshape(*packed[:3], out.shape[-1])
        if not edited and dropout_p == 0.0 and not out.is_meta \
                and parity.wants_sample(cap, site.name):
            _compare_deployed(cap, site, out, given, is_causal, scale)
    finally:
        cap.busy = False
    return out


def _compare_deployed(cap: ActiveCapture, site: Site, out: torch.Tensor,
                      given: tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                   torch.Tensor | None, bool],
                      is_causal: bool, scale: float | None) -> None:
    """Run the deployed kernel on the call's own arguments ``given`` (query, key, value,
    attn_mask, enable_gqa) and keep the gap between its output and the explicit ``out``."""
    query, key, value, attn_mask, enable_gqa = given
    with torch.no_grad():
        fused = DEPLOYED_SDPA(query, key, value, attn_mask=attn_mask, is_causal=is_causal,
                              scale=scale, enable_gqa=enable_gqa)
    parity.measure(cap, site.name, fused, out)


def _packed_gqa(frame: FrameType, query: torch.Tensor, key: torch.Tensor) -> bool:
    """Hugging Face's SDPA integration runs a one-token step of grouped-query attention
    with the query heads of each key/value head packed onto the query axis,
    ``(B, kv_heads, groups, d)`` (``pack_gqa``); True for such a call, whose rows are
    heads, not positions."""
    return (frame.f_code.co_name == "sdpa_attention_forward" and query.ndim == 4
            and query.shape[-2] > 1 and key.shape[-3] == query.shape[-3]
            and frame.f_locals.get("q_length") == 1)


def _explicit(cap: ActiveCapture, site: Site, names: Callable[[], Mapping[str, Any]],
              query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attn_mask: torch.Tensor | None,
              dropout_p: float, is_causal: bool, scale: float | None,
              enable_gqa: bool) -> tuple[torch.Tensor, bool]:
    """query (..., L, E), key (..., S, E), value (..., S, Ev) -> output (..., L, Ev), and
    whether an edit replaced any of its weights or reads.

    ``names``: the caller's locals, for a layout that folds heads into the batch. Rows no
    record needs (prompt rows outside every prompt view) run the model's own kernel; the
    rest are computed explicitly in query blocks within the capture's memory budget
    (:mod:`attnaudit.capturing.blocks`)."""
    n_q, n_k = query.shape[-2], key.shape[-2]
    groups = 1  # query heads per key/value head: folded onto the query axis, never repeated
    if enable_gqa and query.ndim >= 3 and key.shape[-3] != query.shape[-3]:
        groups = query.shape[-3] // key.shape[-3]
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    first = cap.first_needed_row(site, n_q, n_k)
    outputs = []
    call: _Call | None = None
    if first > 0:
        # is_causal is top-left aligned, so the call's first rows keep it as they are
        outputs.append(ORIGINAL_SDPA(query[..., :first, :], key, value,
                                     attn_mask=_mask_rows(attn_mask, 0, first, n_q),
                                     dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                                     enable_gqa=groups > 1))
    if first < n_q:
        compute = torch.float32 if query.dtype in (torch.float16, torch.bfloat16) else query.dtype
        call = _Call(cap, site, names, query, key.to(compute).transpose(-2, -1), value,
                     attn_mask, dropout_p, is_causal, scale, compute, groups)
        key_lead = key.shape[:-2] if groups == 1 else (*key.shape[:-3], key.shape[-3] * groups)
        lead = math.prod(torch.broadcast_shapes(query.shape[:-2], key_lead))
        rows = block_rows(lead * n_k, cap.max_memory)
        outputs.extend(call.block(first + start, first + stop)
                       for start, stop in query_blocks(n_q - first, rows))
    edited = call is not None and call.edited
    return (outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=-2)), edited


def _grouped_matmul(rows: torch.Tensor, per_group: torch.Tensor, groups: int) -> torch.Tensor:
    """``rows`` (..., H, L, X) times ``per_group`` (..., H / groups, X, Y), query head ``h``
    with group ``h // groups`` (as ``repeat_interleave(groups, dim=-3)`` pairs them), without
    repeating ``per_group``: the heads of a group are folded onto the rows. (..., H, L, Y)."""
    if groups == 1:
        return torch.matmul(rows, per_group)
    *lead, heads, n_rows, width = rows.shape
    folded = rows.reshape(*lead, heads // groups, groups * n_rows, width)
    return torch.matmul(folded, per_group).reshape(*lead, heads, n_rows, per_group.shape[-1])


def _mask_rows(mask: torch.Tensor | None, start: int, stop: int, n_q: int
               ) -> torch.Tensor | None:
    """An ``attn_mask`` cut to query rows ``start:stop`` (one broadcast over the queries is
    kept whole)."""
    if mask is None or mask.ndim < 2 or mask.shape[-2] != n_q:
        return mask
    return mask[..., start:stop, :]


def _causal_rows(start: int, stop: int, n_k: int, device: torch.device) -> torch.Tensor:
    """Query rows ``start:stop`` of ``is_causal``'s top-left aligned lower triangle over
    ``n_k`` keys, bool (True where a key may be attended)."""
    return torch.ones(stop - start, n_k, dtype=torch.bool, device=device).tril(start)


class _Call:
    """One SDPA call computed explicitly, block of query rows by block (see the module
    docstring); ``key_t``: the keys in the compute dtype, transposed (..., E, S);
    ``groups``: query heads per key/value head (grouped-query attention; 1: one each)."""

    def __init__(self, cap: ActiveCapture, site: Site, names: Callable[[], Mapping[str, Any]],
                 query: torch.Tensor, key_t: torch.Tensor, value: torch.Tensor,
                 attn_mask: torch.Tensor | None, dropout_p: float, is_causal: bool,
                 scale: float, compute: torch.dtype, groups: int = 1) -> None:
        self.cap, self.site, self.names = cap, site, names
        self.query, self.key_t, self.value, self.attn_mask = query, key_t, value, attn_mask
        self.dropout_p, self.is_causal, self.scale, self.compute = (dropout_p, is_causal,
                                                                    scale, compute)
        self.groups = groups
        self.values4: torch.Tensor | None = None  # one tensor shared by every block
        self.edited = False  # did an edit replace any block's weights?

    def values(self, layout: Layout) -> torch.Tensor:
        """The call's values as ``(B, H, K, d_v)``, made when first asked for (only a
        capture that keeps values or edits them asks) and shared by every block."""
        if self.values4 is None:
            per_head = self.value if self.groups == 1 else self.value.repeat_interleave(
                self.groups, dim=-3)
            self.values4 = layout.values_to_record(per_head)
        return self.values4

    def block(self, start: int, stop: int) -> torch.Tensor:
        """Output rows ``start:stop`` (..., stop - start, Ev), their weights recorded."""
        n_q, n_k = self.query.shape[-2], self.key_t.shape[-1]
        query = self.query[..., start:stop, :]
        scores = _grouped_matmul(query.to(self.compute), self.key_t, self.groups).mul_(self.scale)
        mask = _mask_rows(self.attn_mask, start, stop, n_q)
        allowed = None
        if self.is_causal:
            allowed = _causal_rows(start, stop, n_k, query.device)
        if mask is not None:
            if mask.dtype == torch.bool:
                allowed = mask
            else:
                scores = scores.add_(mask.to(self.compute))
        if allowed is not None:
            scores = scores.masked_fill_(~allowed, float("-inf"))
        weights = ORIGINAL_TORCH_SOFTMAX(scores, dim=-1)
        # Rows with every key masked: softmax gives NaN, the fused kernels zero. Found on
        # the (small, head-broadcast) mask rather than on the scores. On CPU, looking first
        # skips a pass over the weights in the common case; on an accelerator looking would
        # make the host wait for the device at every call, so the fill runs regardless.
        if allowed is not None:
            dead = ~allowed.any(dim=-1, keepdim=True)
        elif mask is not None:
            dead = torch.isneginf(mask).all(dim=-1, keepdim=True)
        else:
            dead = None
        if dead is not None and (dead.device.type != "cpu" or bool(dead.any())):
            weights = weights.masked_fill(dead, 0.0)
        weights = weights.to(self.value.dtype)
        cap = self.cap
        layout = cap.layout(self.site, tuple(weights.shape), -1, self.names, query_last=True)

        def eligibility() -> torch.Tensor:
            if allowed is not None:
                return layout.to_record(allowed)
            if mask is not None:
                return layout.to_record(eligible_from_scores(mask))
            return torch.ones(1, 1, 1, n_k, dtype=torch.bool, device=weights.device)

        edited = cap.record(self.site, layout, layout.to_record(weights), eligibility,
                            layout.to_record(scores), lambda: self.values(layout),
                            trailing=n_q - stop)
        self.edited |= edited is not None
        used = weights if edited is None else layout.from_record(edited)
        if self.dropout_p > 0.0:
            used = F.dropout(used, p=self.dropout_p, training=True)
        read = None if cap.value_edit is None else cap.value_read(layout.to_record(used),
                                                                  self.values(layout))
        if read is None:
            return _grouped_matmul(used, self.value, self.groups)
        self.edited = True
        return layout.read_from_record(read)


def install(stack: ExitStack, namespaces: list[dict[str, Any]]) -> None:
    """Route ``F.scaled_dot_product_attention`` (and direct imports of it) through capture;
    what it was until now is the deployed kernel backend parity compares with."""
    patch_attr(stack, sys.modules[__name__], "DEPLOYED_SDPA", F.scaled_dot_product_attention)
    patch_attr(stack, F, "scaled_dot_product_attention", scaled_dot_product_attention)
    patch_references(stack, namespaces, {id(ORIGINAL_SDPA): scaled_dot_product_attention})
