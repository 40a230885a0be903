"""Prompt views with leading keys (``prompt_views(..., lead=E)``): a model that prepends E
positions of its own to every sequence (CPM-Ant's learned prompt) runs each call over E
keys before the sequence's, and a full pass over E query rows before its own. The views
keep the sequence's keys only, in absolute positions; the weight on the E keys is the
record's sink (view row + sink = the raw row's sum); a cached step over E + P + t keys
gives the full pass's rows; an edit of a view leaves the leading keys' weights as they
were. Expected values are the rule written out by hand on the raw weights, in float64."""

from __future__ import annotations

import torch
from torch import nn

import attnaudit
from attnaudit.capturing.views import prompt_views

B, E, P, T = 2, 3, 4, 3  # batch, leading positions, prompt, continuation rows
N = E + P + T - 1  # the pass's positions: lead + prompt + continuation inputs


class LeadAttention(nn.Module):
    """Every row sees the E leading keys and the sequence causally: (B, 1, Q, K) weights."""

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        queries, keys = scores.shape[-2:]
        seen = torch.ones(keys, keys, dtype=torch.bool).tril()[-queries:]
        seen[:, :E] = True
        return torch.softmax(scores.masked_fill(~seen, float("-inf")), -1)


def by_hand(raw: torch.Tensor) -> dict[str, torch.Tensor]:
    """The views and sink of a full pass's raw weights (B, 1, N, N): rows E+P-1.., the
    sequence's keys renormalised per view and scaled by what the row holds on them."""
    rows = raw[:, :, E + P - 1:].double()
    seq = rows[..., E:]
    total = seq.sum(-1, keepdim=True)
    out = {"sink": rows[..., :E].sum(-1, keepdim=True)}
    for kind, cut in (("cross", slice(0, P)), ("self", slice(P - 1, None))):
        block = seq[..., cut]
        out[kind] = block / block.sum(-1, keepdim=True) * total
    return out


def scores() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(B, 1, N, N, dtype=torch.float64)


def test_views_keep_the_sequence_keys_and_count_the_lead_as_sink():
    model, s = LeadAttention(), scores()
    raw = model(s)
    with prompt_views(P, lead=E), attnaudit.capture(model) as cap:
        model(s)
    expected = by_hand(raw)
    assert sorted(cap.records) == ["forward:cross", "forward:self"]
    for kind in ("cross", "self"):
        rec = cap.records[f"forward:{kind}"]
        assert rec.weights.shape == (B, 1, T, P if kind == "cross" else T)
        torch.testing.assert_close(rec.weights.double(), expected[kind], rtol=0, atol=1e-12)
        torch.testing.assert_close(rec.sink.double(), expected["sink"], rtol=0, atol=1e-12)
        torch.testing.assert_close(rec.weights.double().sum(-1) + rec.sink[..., 0].double(),
                                   torch.ones(B, 1, T, dtype=torch.float64))
    assert expected["sink"].min() > 0.05  # the lead holds real weight: the test can fail


def test_a_cached_step_gives_the_full_pass_rows():
    model, s = LeadAttention(), scores()
    expected = by_hand(model(s))
    for t in range(T):
        row = s[:, :, E + P - 1 + t : E + P + t, : E + P + t]  # step t: one query, lead + P + t
        with prompt_views(P, positions=P + t, lead=E), attnaudit.capture(model) as cap:
            model(row)
        cross, own = cap.records["forward:cross"], cap.records["forward:self"]
        torch.testing.assert_close(cross.weights.double()[:, :, 0], expected["cross"][:, :, t],
                                   rtol=0, atol=1e-12)
        torch.testing.assert_close(own.weights.double()[:, :, 0, : t + 1],
                                   expected["self"][:, :, t, : t + 1], rtol=0, atol=1e-12)
        torch.testing.assert_close(cross.sink.double()[:, :, 0], expected["sink"][:, :, t],
                                   rtol=0, atol=1e-12)


def uniform_cross(site, weights, key_mask):
    if site.kind != "cross":
        return None
    return torch.full_like(weights, 1.0) * weights.sum(-1, keepdim=True) / weights.shape[-1]


def test_an_edit_of_a_view_leaves_the_leading_keys_as_they_were():
    model, s = LeadAttention(), scores()
    raw = model(s)
    with prompt_views(P, lead=E), attnaudit.capture(model, edit=uniform_cross):
        edited = model(s)
    rows = slice(E + P - 1, None)
    torch.testing.assert_close(edited[:, :, rows, :E], raw[:, :, rows, :E], rtol=0, atol=0)
    mass = raw[:, :, rows, E : E + P].sum(-1, keepdim=True)  # the prompt's share, kept
    torch.testing.assert_close(edited[:, :, rows, E : E + P], (mass / P).expand(-1, -1, -1, P),
                               rtol=0, atol=1e-12)
    torch.testing.assert_close(edited[:, :, rows, E + P:], raw[:, :, rows, E + P:], rtol=0,
                               atol=0)
    torch.testing.assert_close(edited[:, :, : E + P - 1], raw[:, :, : E + P - 1], rtol=0, atol=0)
