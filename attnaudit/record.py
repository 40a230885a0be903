"""What capture produces: one :class:`AttentionRecord` per attention site.

Every record presents weights in one layout, ``(batch, heads, queries, keys)``; heads is 1
for single-head attention. A site called several times (a decoder step loop, or
``generate()`` with a cache) keeps one :class:`AttentionCall` per call and stacks them along
the query axis, in call order. When calls see different numbers of keys (a growing
self-attention cache), the key axis is right-padded with zero weight and ``False``
eligibility, so padded keys read as ineligible.

The one role vocabulary (:class:`Role`) names what an attention site does for the audit; the
capture records, the tables' ``role`` column, the contribution traces, the explorer and the
docs all use these strings. Each target family (:class:`Family`) declares the roles its
sites take (:mod:`attnaudit.targets.contract`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

import torch

from attnaudit.errors import CaptureOptionError

Kind = str  # "self" or "cross": what a site attends over, as capture finds it


class Role(StrEnum):
    """What an attention site does for the audit, in the one vocabulary every layer uses.

    An encoder-decoder model has ``encoder_self`` (source over source), ``decoder_self``
    (steps over the inputs before them) and ``cross`` (steps over the source). A decoder-only
    model's prompt views (:mod:`attnaudit.capturing.views`) are the continuation over the
    prompt, :attr:`PROMPT`, and over itself, :attr:`CONTINUATION`: the same strings as
    ``cross`` and ``decoder_self`` (the prompt stands where a source does, and the tables
    keep one column of roles); its raw self-attention over every earlier position is
    ``self``. ``captured`` is any other attention (no declared key rule fits it).
    """

    ENCODER_SELF = "encoder_self"
    DECODER_SELF = "decoder_self"
    CROSS = "cross"
    SELF = "self"
    CAPTURED = "captured"
    PROMPT = "cross"  # an alias: a decoder-only continuation over its prompt
    CONTINUATION = "decoder_self"  # an alias: a decoder-only continuation over itself


class Family(StrEnum):
    """The kind of model a target runs: the encoder-decoder family (a source encoded once,
    a decoder attending over it) or the decoder-only family (prompt -> continuation)."""

    ENCODER_DECODER = "encoder-decoder"
    DECODER_ONLY = "decoder-only"


@dataclass(frozen=True)
class Site:
    """Where attention was computed.

    ``name`` is the module path (plus the method, for attention computed outside
    ``forward``), suffixed ``:self`` / ``:cross`` when the kind is known. ``mechanism`` says
    which adapter saw it: ``softmax``, ``sdpa``, ``mha`` or ``tap``. ``role`` is the site's
    :class:`Role` where capture knows it (a prompt view's ``:cross`` is
    :attr:`Role.PROMPT`, its ``:self`` :attr:`Role.CONTINUATION`), else None: the layers
    above decide it from the target. ``call`` is the 0-based
    call index at this site and ``query_offset`` where this call's queries start in the
    stacked record; both are 0 on a record's own ``site``.

    ``layout`` is how the model's own tensor lays attention out, over the letters ``b h q k``
    (``"b h q k"``; ``"(b h) q k"`` for heads folded into the batch; ``"k b"`` for a softmax
    over the first axis), and ``layout_source`` how that was determined: ``call`` (the
    tensor or the call's arguments say it), ``stated`` (``capture(heads=...)``),
    ``inferred`` (names at the call site: ``num_heads``, ``bsz``..., or the module's head
    count) or ``default`` (nothing said anything: the leading axis is the batch, one head).
    Both are empty until the site's first call is recorded.
    """

    name: str
    kind: Kind | None
    mechanism: str
    module: str
    call: int = 0
    query_offset: int = 0
    layout: str = ""
    layout_source: str = ""
    role: Role | None = None

    def __str__(self) -> str:
        return self.name


@dataclass
class AttentionCall:
    """One call at a site.

    weights: ``(batch, heads, queries, keys)``, detached, in the model's dtype.
    key_mask: bool, broadcastable to ``weights``, True where a key is eligible; computed on
        first access from what the call saw (mask arguments, or scores filled with very
        negative values), ``None`` when unknowable.
    scores: pre-softmax scores ``(batch, heads, queries, keys)`` when kept, else None.
    values: ``(batch, heads, keys, d_v)`` when kept and reachable, else None.
    sink: ``(batch, heads, queries, 1)``, the weight each row put on sink columns (learned
        logits the softmax normalised with the keys, reading no value: GPT-OSS) or, in a
        prompt view, on a model's own leading positions (CPM-Ant's learned prompt); the
        row's keys hold the rest. None when the call has no sink.
    share: ``(batch, heads, queries, 1)`` float64, for a prompt view
        (:mod:`attnaudit.capturing.views`): the share of the raw row's total its keys held
        before it was renormalised; None for a call stored as it is.
    """

    weights: torch.Tensor
    mask_source: Callable[[], torch.Tensor | None] | None = None
    scores: torch.Tensor | None = None
    values: torch.Tensor | None = None
    sink: torch.Tensor | None = None
    share: torch.Tensor | None = None
    _key_mask: torch.Tensor | None = field(default=None, repr=False)
    _mask_done: bool = field(default=False, repr=False)

    @property
    def key_mask(self) -> torch.Tensor | None:
        if not self._mask_done:
            self._key_mask = None if self.mask_source is None else self.mask_source()
            self.mask_source = None
            self._mask_done = True
        return self._key_mask


def pad_keys(t: torch.Tensor, n_keys: int, fill: float | bool) -> torch.Tensor:
    """Right-pad the last (key) axis of ``t`` to ``n_keys`` with ``fill``."""
    missing = n_keys - t.shape[-1]
    if missing == 0:
        return t
    pad = torch.full((*t.shape[:-1], missing), fill, dtype=t.dtype, device=t.device)
    return torch.cat([t, pad], dim=-1)


class AttentionRecord:
    """Everything captured at one site: calls stacked along the query axis."""

    def __init__(self, site: Site) -> None:
        self.site = site
        self.calls: list[AttentionCall] = []
        self.n_queries = 0  # stacked query count so far
        self._stacked: dict[str, tuple[int, torch.Tensor | None]] = {}

    def __repr__(self) -> str:
        shape = tuple(self.weights.shape) if self.calls else ()
        return (f"AttentionRecord({self.site.name!r}, kind={self.kind!r}, "
                f"calls={len(self.calls)}, weights={shape})")

    def append(self, call: AttentionCall) -> tuple[int, int]:
        """Add a call; return its index and where its queries start on the stacked axis."""
        index, offset = len(self.calls), self.n_queries
        self.calls.append(call)
        self.n_queries += call.weights.shape[2]
        return index, offset

    @property
    def name(self) -> str:
        return self.site.name

    @property
    def kind(self) -> Kind | None:
        return self.site.kind

    @property
    def weights(self) -> torch.Tensor:
        """``(batch, heads, queries, keys)``; keys beyond a call's own key count are 0."""
        return self._stack("weights", lambda c: c.weights, 0.0)

    @property
    def scores(self) -> torch.Tensor | None:
        """Pre-softmax scores when kept (``capture(..., scores=True)``); padding is -inf."""
        if any(c.scores is None for c in self.calls):
            return None
        return self._stack("scores", lambda c: c.scores, float("-inf"))

    @property
    def sink(self) -> torch.Tensor | None:
        """``(batch, heads, queries, 1)``: the weight each row put on sink columns, which are
        no keys (a row's keys plus its sink sum to one); None when no call had a sink."""
        if not self.calls or all(c.sink is None for c in self.calls):
            return None
        return self._stack("sink", lambda c: c.sink if c.sink is not None
                           else c.weights.new_zeros(*c.weights.shape[:3], 1), 0.0)

    @property
    def share(self) -> torch.Tensor | None:
        """``(batch, heads, queries, 1)``: for a prompt view, the share of each raw row its
        keys held (an edit of the view moves that much of the row); None otherwise."""
        if not self.calls or any(c.share is None for c in self.calls):
            return None
        return self._stack("share", lambda c: c.share, 0.0)

    @property
    def values(self) -> torch.Tensor | None:
        """Values ``(batch, heads, keys, d_v)`` of the last call, when kept and reachable."""
        return self.calls[-1].values if self.calls else None

    @property
    def key_mask(self) -> torch.Tensor | None:
        """Bool, broadcastable to :attr:`weights`, True where a key is eligible; or None."""
        cached = self._stacked.get("key_mask")
        if cached is not None and cached[0] == len(self.calls):
            return cached[1]
        mask = self._stack_masks()
        self._stacked["key_mask"] = (len(self.calls), mask)
        return mask

    def _check_stackable(self) -> None:
        if not self.calls:
            raise CaptureOptionError(f"site {self.name!r} recorded no calls")
        lead = {tuple(c.weights.shape[:2]) for c in self.calls}
        if len(lead) > 1:
            raise CaptureOptionError(
                f"site {self.name!r} was called with different (batch, heads) {sorted(lead)}; "
                "stacking along the query axis needs one: read record.calls, or capture "
                "each pass in its own `with attnaudit.capture(...)` block"
            )

    def _stack(self, key: str, get: Callable[[AttentionCall], torch.Tensor | None],
               fill: float) -> torch.Tensor:
        cached = self._stacked.get(key)
        if cached is not None and cached[0] == len(self.calls) and cached[1] is not None:
            return cached[1]
        self._check_stackable()
        parts: list[torch.Tensor] = []
        for call in self.calls:
            part = get(call)
            if part is None:  # the properties stack a tensor only when every call has one
                raise CaptureOptionError(f"site {self.name!r}: a call recorded no {key}")
            parts.append(part)
        n_keys = max(p.shape[-1] for p in parts)
        parts = [pad_keys(p, n_keys, fill) for p in parts]
        stacked = parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)
        self._stacked[key] = (len(self.calls), stacked)
        return stacked

    def _stack_masks(self) -> torch.Tensor | None:
        self._check_stackable()
        masks = [c.key_mask for c in self.calls]
        key_counts = [c.weights.shape[-1] for c in self.calls]
        n_keys = max(key_counts)
        if all(m is None for m in masks) and min(key_counts) == n_keys:
            return None
        if len(self.calls) == 1:
            return masks[0]
        batch, heads = self.calls[0].weights.shape[:2]
        lead_b = batch if any(m is not None and m.shape[0] != 1 for m in masks) else 1
        lead_h = heads if any(m is not None and m.shape[1] != 1 for m in masks) else 1
        parts = []
        for call, mask, k in zip(self.calls, masks, key_counts, strict=True):
            q = call.weights.shape[2]
            if mask is None:
                mask = torch.ones(1, 1, 1, k, dtype=torch.bool, device=call.weights.device)
            mask = mask.expand(lead_b, lead_h, q, k)
            parts.append(pad_keys(mask, n_keys, False))
        return torch.cat(parts, dim=2)
