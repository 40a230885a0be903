"""The layout rules on their own: which axis is which, read from names a call site knows.

Each case is a tensor laid out the way a known codebase lays it out, built from a
``(B, H, Q, K)`` tensor by hand; the rule must map it back exactly and map an edit back into
the codebase's own layout.
"""

from __future__ import annotations

import pytest
import torch

from attnaudit.capturing.layout import CallSite, resolve_layout

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
    "keys first (S, B)": (lambda t: t[:, 0, 0].T, 0, CallSite(), "k b", "default"),
    "heads third (LED encoder)": (
        lambda t: t.transpose(1, 2), -1, CallSite(owner_heads=H), "b q h k", "inferred"),
    "blocks before heads (LongT5 local)": (
        lambda t: t.reshape(B, H, 2, Q // 2, K).transpose(1, 2), -1, CallSite(owner_heads=H),
        "b q h q k", "inferred"),
    "blocks after heads (Pegasus-X local)": (
        lambda t: t.reshape(B, H, 2, Q // 2, K), -1, CallSite(names={"num_heads": H}),
        "b h q q k", "inferred"),
    "grouped-query heads packed on the query axis (HF decoding step)": (
        lambda t: t[:, :, :1].reshape(B, 1, H, K), -1,
        CallSite(names={"q_length": 1}, query_last=True), "b h (h q) k", "inferred"),
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
        "grouped-query heads packed on the query axis (HF decoding step)": full[:, :, :1],
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
