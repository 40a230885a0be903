"""Bring attention tensors into the record layout ``(batch, heads, queries, keys)``.

Models lay attention out in many ways: ``(B, H, Q, K)``; heads folded into the batch,
``(B*H, Q, K)``; all decoder steps folded into the batch, ``(B*T, K)``; query-major
``(T, B, K)``; keys on a non-last axis (``softmax(scores, dim=0)`` over ``(K, B)``). A
:class:`Layout` names how one call's tensor maps onto the record layout, as a pattern over
the letters ``b h q k`` (``"(b h) q k"``, ``"(b q) k"``, ``"k b"``), and maps tensors both
ways: a call's weights into the record, and an edit's record-shaped result back into the
shape the model's code expects.

Folds are batch-major (``index = b * H + h``), as ``view(B, H, ...)`` / ``view(B * H, ...)``
and PyTorch's and Hugging Face's own attention code produce them. A fold's size is read
from what the call site knows, in this order: the user's statement (``heads=``), the call
itself (a 4-D tensor, ``F.multi_head_attention_forward``'s arguments), integers in the
calling frame named like a head count or batch size (``num_heads``, ``bsz``, ``batch``...),
the owning module's head-count attribute. ``Layout.source`` says which: ``call``,
``stated``, ``inferred`` or ``default`` (nothing at the call site said anything, so the
leading axis is read as the batch and there is one head).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import torch

# Scores at or below this were masked by the model (-inf, finfo.min, -1e9 fills...).
MASKED_SCORE = -1e4

HEAD_NAMES = ("num_heads", "n_heads", "nheads", "n_head", "nhead", "heads", "head_count",
              "num_attention_heads", "num_attn_heads", "h")
BATCH_NAMES = ("bsz", "batch_size", "batch", "batch_sz", "bs", "nbatches", "n_batch", "B")
QUERY_NAMES = ("tgt_len", "target_l", "target_len", "q_len", "q_length", "query_len", "len_q",
               "T")

@dataclass(frozen=True)
class CallSite:
    """What the code that produced a call's attention knows about its layout.

    heads: a stated head count (``capture(heads=...)``), else None. names: integers in the
    calling frame, by name. owner_heads: the owning module's head-count attribute.
    from_call: True when ``names`` are the attention function's own arguments (PyTorch's
    ``F.multi_head_attention_forward``), so a layout read from them is the call's own.
    query_last: True when the axis before the keys is known to be the queries
    (``F.scaled_dot_product_attention``'s ``(..., L, S)``).
    """

    heads: int | None = None
    names: Mapping[str, int] | None = None
    owner_heads: int | None = None
    from_call: bool = False
    query_last: bool = False

    def first(self, candidates: tuple[str, ...]) -> int | None:
        for name in candidates:
            value = (self.names or {}).get(name)
            if value is not None:
                return value
        return None


def int_locals(f_locals: Mapping[str, Any]) -> dict[str, int]:
    """The positive integers among a frame's locals whose names could size a fold."""
    wanted = (*HEAD_NAMES, *BATCH_NAMES, *QUERY_NAMES)
    return {n: v for n in wanted
            if type(v := f_locals.get(n)) is int and v > 0}


def module_heads(module: object) -> int | None:
    """A module's own head count (``num_heads``, ``n_heads``...), when it states one."""
    for name in HEAD_NAMES:
        value = getattr(module, name, None)
        if type(value) is int and value > 0:
            return value
    return None


Group = Sequence[tuple[str, int]]  # one axis of a call's tensor: its letters and sizes


@dataclass(frozen=True)
class Layout:
    """How a call's tensor of shape ``shape`` maps onto ``(batch, heads, queries, keys)``.

    pattern: the call's axes in order, keys ``k``, folded axes in parentheses, size-1 axes
    after the keys that carry nothing ``1``. source: how it was determined (see the module
    docstring). groups: per axis of the tensor with keys moved last, its letters and sizes.
    """

    shape: tuple[int, ...]
    pattern: str
    source: str
    key_dim: int
    groups: tuple[Group, ...]

    @cached_property
    def _letters(self) -> list[tuple[str, int]]:
        return [pair for group in self.groups for pair in group]

    @cached_property
    def _order(self) -> list[int]:
        letters = self._letters
        return sorted(range(len(letters)), key=lambda i: ("bhqk".index(letters[i][0]), i))

    @cached_property
    def bhqk(self) -> tuple[int, int, int, int]:
        """The record shape ``(B, H, Q, K)`` of a call's full tensor."""
        return _merged(self._letters)

    @cached_property
    def _plain(self) -> bool:
        """Keys last and nothing reordered: a reshape maps the call's tensor."""
        return self.key_dim == len(self.shape) - 1 and self._order == sorted(self._order)

    def _sizes(self, t: torch.Tensor) -> list[int]:
        """Unfolded sizes of ``t`` (keys last), 1 throughout a group on a broadcast axis."""
        sizes: list[int] = []
        for n, group in zip(t.shape, self.groups, strict=True):
            sizes += [1] * len(group) if n == 1 else [s for _, s in group]
        return sizes

    def to_record(self, t: torch.Tensor) -> torch.Tensor:
        """The call's tensor (``shape``, or a mask broadcastable to it) as ``(B, H, Q, K)``;
        a broadcast axis stays size 1."""
        if self._plain and tuple(t.shape) == self.shape:
            return t if self.shape == self.bhqk else t.reshape(self.bhqk)
        if t.ndim > len(self.shape):
            raise ValueError(f"key mask has {t.ndim} axes, attention weights only "
                             f"{len(self.shape)}")
        try:
            torch.broadcast_shapes(t.shape, self.shape)
        except RuntimeError:
            raise ValueError(f"key mask of shape {tuple(t.shape)} does not broadcast to "
                             f"attention weights of shape {self.shape}") from None
        t = t.reshape((1,) * (len(self.shape) - t.ndim) + tuple(t.shape)).movedim(self.key_dim, -1)
        sizes = self._sizes(t)
        merged = _merged([(x, n) for (x, _), n in zip(self._letters, sizes, strict=True)])
        return t.reshape(sizes).permute(self._order).reshape(merged)

    def from_record(self, w: torch.Tensor) -> torch.Tensor:
        """An edit's ``(B, H, Q, K)`` result back in the call's shape."""
        if self._plain and self.shape == self.bhqk:
            return w
        order, letters = self._order, self._letters
        inverse = sorted(range(len(order)), key=order.__getitem__)
        moved = [n for i, n in enumerate(self.shape) if i != self.key_dim]
        t = w.reshape([letters[i][1] for i in order]).permute(inverse)
        return t.reshape(*moved, self.shape[self.key_dim]).movedim(-1, self.key_dim)

    def values_to_record(self, value: torch.Tensor) -> torch.Tensor:
        """Values ``(..., K, d_v)`` of a call whose weights are ``(..., Q, K)`` (keys last, as
        in ``F.scaled_dot_product_attention``) as ``(B, H, K, d_v)``. Values broadcast over
        heads (multi-query: one key/value head for every query head) are expanded, as the
        call broadcasts them, without a copy."""
        value = value.expand(*self.shape[:-2], *value.shape[-2:])
        d_v = value.shape[-1]
        *lead, queries, keys = self.groups
        queries = tuple((x, d_v if x == "q" else n) for x, n in queries)
        as_weights = replace(self, shape=(*value.shape[:-2], d_v, value.shape[-2]),
                             groups=(*lead, queries, keys))
        return as_weights.to_record(value.transpose(-2, -1)).transpose(-2, -1)

    def read_from_record(self, read: torch.Tensor) -> torch.Tensor:
        """A read ``(B, H, Q, d_v)`` — weights times values — back in the shape of the call's
        output ``(..., Q, d_v)``, for a call whose weights are ``(..., Q, K)`` (keys last, as
        in ``F.scaled_dot_product_attention``)."""
        *lead, queries, _ = self.groups
        d_v = read.shape[-1]
        as_reads = replace(self, shape=(*self.shape[:-1], d_v),
                           groups=(*lead, queries, (("k", d_v),)))
        return as_reads.from_record(read)


def _merged(letters: Sequence[tuple[str, int]]) -> tuple[int, int, int, int]:
    """``(B, H, Q, K)``: the product of the sizes under each letter."""
    size = dict.fromkeys("bhqk", 1)
    for letter, n in letters:
        size[letter] *= n
    return size["b"], size["h"], size["q"], size["k"]


def resolve_layout(shape: tuple[int, ...], key_dim: int, site: CallSite) -> Layout:
    """The layout of a call's tensor whose softmax normalised axis ``key_dim``.

    Raises ValueError when a stated head count does not divide the folded axis.
    """
    ndim = len(shape)
    if ndim == 0:
        raise ValueError("attention weights must have at least one (key) axis")
    key_dim %= ndim
    # Size-1 axes after the key axis carry nothing (attention pooling over (B, n, 1)).
    n_ones = ndim - 1 - key_dim if all(n == 1 for n in shape[key_dim + 1:]) else 0
    carried = [n for i, n in enumerate(shape[: ndim - n_ones]) if i != key_dim]
    groups, source = _groups(carried, site)
    groups += [(("h", 1),)] * n_ones
    names = [_group_name(g) for g in groups[: len(carried)]] + ["1"] * n_ones
    names.insert(key_dim, "k")
    groups.append((("k", shape[key_dim]),))
    return Layout(shape=tuple(shape), pattern=" ".join(names), source=source, key_dim=key_dim,
                  groups=tuple(tuple(g) for g in groups))


def _many_axes(rest: list[int], site: CallSite) -> tuple[list[Group], str]:
    """Three or more non-key axes: ``(B, H, Q)`` as the tensor says, unless a head count known
    at the call site puts the heads on another axis — LED's ``(B, T, H, w)``, LongT5's
    ``(B, blocks, H, block)``, ProphetNet's ``(B, ngram, H, T)``: the other axes are then
    queries — or, with the heads where expected, says the extra axes are query blocks
    (Pegasus-X's ``(B, H, blocks, block)``). Without a head count, extra axes are heads
    (grouped-query ``(B, H_kv, groups, Q)``). A query axis longer than the call's stated
    query length holds heads packed along it (``(B, H_kv, groups * Q)``, Hugging Face's
    grouped-query decoding step)."""
    heads = site.heads or site.first(HEAD_NAMES) or site.owner_heads
    named = "stated" if site.heads else "call" if site.from_call else "inferred"
    letters = ["b", *["h"] * (len(rest) - 2), "q"]
    source = "call"
    queries = site.first(QUERY_NAMES) if site.query_last else None
    packed = queries is not None and rest[-1] != queries and rest[-1] % queries == 0
    n_q = queries if queries is not None else 1  # what packing is read with
    # a step packing each key/value head's query heads along the queries (multi-query:
    # (B, 1, H * Q)) splits the head count over those two axes: no other axis holds it
    split = packed and heads == math.prod(rest[1:-1]) * rest[-1] // n_q
    if heads is not None and rest[1] != heads and not split:
        # the last axis is the queries unless nothing else can hold the heads
        elsewhere = [i for i in range(2, len(rest)) if rest[i] == heads]
        if elsewhere:
            at = elsewhere[0]
            letters = ["b", *("h" if i == at else "q" for i in range(1, len(rest)))]
            source = named
    elif heads is not None and len(rest) > 3:
        letters, source = ["b", "h", *["q"] * (len(rest) - 2)], named
    groups: list[Group] = [[(x, n)] for x, n in zip(letters, rest, strict=True)]
    if packed and letters[-1] == "q":
        groups[-1] = [("h", rest[-1] // n_q), ("q", n_q)]
        source = "call" if site.from_call else "inferred"
    return groups, source


def _group_name(group: Group) -> str:
    letters = [x for x, _ in group]
    return letters[0] if len(letters) == 1 else "(" + " ".join(letters) + ")"


def _groups(rest: list[int], site: CallSite) -> tuple[list[Group], str]:
    """Letters and sizes for the non-key axes ``rest`` (in order), and how they were found."""
    if len(rest) >= 3:
        return _many_axes(rest, site)
    if not rest:
        return [], "call"
    if site.query_last and len(rest) == 1:  # unbatched (L, S)
        return [[("b", 1), ("q", rest[0])]], "call"
    lead, tail = rest[0], [[("q", n)] for n in rest[1:]]
    if site.heads is not None:
        if lead % site.heads:
            raise ValueError(f"stated head count {site.heads} does not divide the attention's "
                             f"leading axis of size {lead} (shape {(*rest, 'K')})")
        return [[("b", lead // site.heads), ("h", site.heads)], *tail], "stated"
    found = "call" if site.from_call else "inferred"
    heads, batch = site.first(HEAD_NAMES), site.first(BATCH_NAMES)
    if heads is not None and batch is not None and lead == batch:
        return [[("b", lead)], *tail], found
    if heads is not None and heads > 1 and lead % heads == 0:
        return [[("b", lead // heads), ("h", heads)], *tail], found
    steps = site.first(QUERY_NAMES)
    if batch is not None:
        if lead == batch:
            return [[("b", lead)], *tail], found
        # query-major (T, B, S) unless the query count is named and is not T: a one-query
        # step of one sequence with heads folded, (H, 1, S), has B = Q = 1 too
        if len(rest) == 2 and rest[1] == batch and not site.query_last \
                and steps in (None, lead):
            return [[("q", lead)], [("b", batch)]], found
        if lead % batch == 0:  # (B*H, Q, K), or every decoder step at once: (B*T, K)
            fold = "h" if tail else "q"
            return [[("b", batch), (fold, lead // batch)], *tail], found
    if not tail and steps is not None and steps > 1 and lead % steps == 0 and lead != steps:
        return [[("b", lead // steps), ("q", steps)]], found
    owner = site.owner_heads
    if owner is not None and owner > 1 and lead % owner == 0:
        return [[("b", lead // owner), ("h", owner)], *tail], "inferred"
    return [[("b", lead)], *tail], "default"


def eligible_from_scores(scores: torch.Tensor) -> torch.Tensor:
    """Bool mask, True where the score was not filled with a masking value.

    NaN scores count as eligible, so a NaN row shows up as non-finite weights, not as masked.
    """
    return ~(scores <= MASKED_SCORE)
