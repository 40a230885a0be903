"""The layout rules on their own: which axis is which, read from names a call site knows.

Each case is a tensor laid out the way a known codebase lays it out, built from a
``(B, H, Q, K)`` tensor by hand; the rule must map it back exactly and map an edit back into
the codebase's own layout.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnaudit.capturing.layout import CallSite, Layout, resolve_layout

B, H, Q, K = 2, 3, 4, 5


def bhqk() -> torch.Tensor:
    return torch.arange(B * H * Q * K, dtype=torch.float32).reshape(B, H, Q, K)


CASES = {
    # name: (the model's tensor from (B, H, Q, K), key axis, call site, pattern, source)
    "standard": (lambda t: t, -1, CallSite(), "b h q k", "call"),
    "heads folded (fairseq, LED decoder)": (
        lambda t: t.reshape(B * H, Q, K), -1, CallSite(names={"bsz": B}), "(b h) q k",
        "inferred"),
    "heads folded, module attribute only": (
        lambda t: t.reshape(B * H, Q, K), -1, CallSite(owner_heads=H), "(b h) q k", "inferred"),
    "heads folded, stated": (
        lambda t: t.reshape(B * H, Q, K), -1, CallSite(heads=H), "(b h) q k", "stated"),
    "steps folded (OpenNMT global attention)": (
        lambda t: t[:, :1].reshape(B * Q, K), -1, CallSite(names={"batch": B}), "(b q) k",
        "inferred"),
    "query-major (T, B, S)": (
        lambda t: t[:, 0].transpose(0, 1), -1, CallSite(names={"batch_size": B}), "q b k",
        "inferred"),
    "heads folded, one query of one sequence (fairseq cached step)": (
        lambda t: t[:1, :, :1].reshape(H, 1, K), -1,
        CallSite(names={"bsz": 1, "tgt_len": 1}), "(b h) q k", "inferred"),
    "keys first (S, B)": (lambda t: t[:, 0, 0].T, 0, CallSite(), "k b", "default"),
    "heads third (LED encoder)": (
        lambda t: t.transpose(1, 2), -1, CallSite(owner_heads=H), "b q h k", "inferred"),
    "blocks before heads (LongT5 local)": (
        lambda t: t.reshape(B, H, 2, Q // 2, K).transpose(1, 2), -1, CallSite(owner_heads=H),
        "b q h q k", "inferred"),
    "blocks after heads (Pegasus-X local)": (
        lambda t: t.reshape(B, H, 2, Q // 2, K), -1, CallSite(names={"num_heads": H}),
        "b h q q k", "inferred"),
    "heads after two query axes (blocked local attention)": (
        lambda t: t.reshape(B, H, 2, Q // 2, K).permute(0, 2, 3, 1, 4), -1,
        CallSite(owner_heads=H), "b q q h k", "inferred"),
    "grouped-query heads packed on the query axis (HF decoding step)": (
        lambda t: t[:, :, :1].reshape(B, 1, H, K), -1,
        CallSite(names={"q_length": 1}, query_last=True), "b h (h q) k", "inferred"),
    "multi-query heads packed on the query axis, head count known (GPT-BigCode step)": (
        lambda t: t[:, :, :1].reshape(B, 1, H, K), -1,
        CallSite(names={"q_length": 1}, owner_heads=H, query_last=True), "b h (h q) k",
        "inferred"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_layout_rules_recover_batch_heads_queries_keys(case):
    make, key_dim, site, pattern, source = CASES[case]
    full = bhqk()
    model_view = make(full)
    layout = resolve_layout(tuple(model_view.shape), key_dim, site)
    assert (layout.pattern, layout.source) == (pattern, source)
    record = layout.to_record(model_view)
    # What the model's tensor holds, in (B, H, Q, K): compare by value, not by shape alone.
    expected = {
        "steps folded (OpenNMT global attention)": full[:, :1],
        "query-major (T, B, S)": full[:, :1],
        "keys first (S, B)": full[:, :1, :1],
        "heads folded, one query of one sequence (fairseq cached step)": full[:1, :, :1],
        "grouped-query heads packed on the query axis (HF decoding step)": full[:, :, :1],
        "multi-query heads packed on the query axis, head count known (GPT-BigCode step)":
            full[:, :, :1],
    }.get(case, full)
    assert torch.equal(record, expected)
    edited = record + 1000
    assert torch.equal(layout.from_record(edited), make(full) + 1000)


def test_a_mask_broadcast_over_heads_stays_broadcast():
    layout = resolve_layout((B * H, Q, K), -1, CallSite(heads=H))
    mask = torch.ones(B * H, 1, K, dtype=torch.bool)
    assert layout.to_record(mask).shape == (B, H, 1, K)
    padding = torch.ones(1, 1, K, dtype=torch.bool)
    assert layout.to_record(padding).shape == (1, 1, 1, K)


def reference_record(t: torch.Tensor, groups: list[list[tuple[str, int]]],
                     key_dim: int) -> torch.Tensor:
    """(B, H, Q, K) of a call's tensor by index arithmetic, element by element: each axis
    index splits row-major into its letters' indices, and each letter's indices combine
    row-major in the order the letters appear. No reshape or permute is involved."""
    keys_last = [g for i, g in enumerate(groups) if i != key_dim] + [groups[key_dim]]
    axis_order = [i for i in range(len(groups)) if i != key_dim] + [key_dim]
    size = dict.fromkeys("bhqk", 1)
    for group in groups:
        for letter, n in group:
            size[letter] *= n
    out = torch.empty(size["b"], size["h"], size["q"], size["k"], dtype=t.dtype)
    for index in itertools.product(*(range(n) for n in t.shape)):
        position = dict.fromkeys("bhqk", 0)
        for axis, group in zip(axis_order, keys_last, strict=True):
            rest = index[axis]
            parts = []
            for _, n in reversed(group):
                parts.append(rest % n)
                rest //= n
            for (letter, n), part in zip(group, reversed(parts), strict=True):
                position[letter] = position[letter] * n + part
        out[position["b"], position["h"], position["q"], position["k"]] = t[index]
    return out


@st.composite
def layouts(draw) -> tuple[Layout, list[list[tuple[str, int]]], int]:
    """Any layout the rules can produce: the letters b, h, q in any order and folding
    (several axes of one letter, folds of several letters), keys on any axis."""
    letters = draw(st.lists(st.sampled_from("bhq"), min_size=1, max_size=4))
    sizes = [draw(st.integers(1, 3)) for _ in letters]
    cuts = sorted(set(draw(st.lists(st.integers(1, len(letters)), max_size=3))) - {len(letters)})
    bounds = [0, *cuts, len(letters)]
    groups = [list(zip(letters[a:b], sizes[a:b], strict=True))
              for a, b in itertools.pairwise(bounds)]
    key_dim = draw(st.integers(0, len(groups)))
    groups.insert(key_dim, [("k", draw(st.integers(1, 4)))])
    shape = tuple(math.prod(n for _, n in g) for g in groups)
    keys_last = [g for i, g in enumerate(groups) if i != key_dim] + [groups[key_dim]]
    layout = Layout(shape=shape, pattern="", source="stated", key_dim=key_dim,
                    groups=tuple(tuple(g) for g in keys_last))
    return layout, groups, key_dim


@settings(max_examples=150, deadline=None)
@given(case=layouts())
def test_every_layout_maps_to_the_record_and_back_by_index_arithmetic(case):
    layout, groups, key_dim = case
    call = torch.arange(math.prod(layout.shape), dtype=torch.float64).reshape(layout.shape)
    record = layout.to_record(call)
    assert torch.equal(record, reference_record(call, groups, key_dim))
    assert torch.equal(layout.from_record(record), call)
    # an edit that moves every value lands where the index arithmetic says
    edited = torch.randperm(record.numel()).reshape(record.shape).to(torch.float64)
    assert torch.equal(reference_record(layout.from_record(edited), groups, key_dim), edited)
