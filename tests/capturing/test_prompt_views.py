"""Prompt views under edits: editing both views of one decoder-only call gives what a
hand-written run of the same edits gives (the self view is read after the cross view was
written, as the views' rule says), and the model's output reads the edited weights. Views
are computed in the weights' dtype when it is float32 or wider (float64 here)."""

from __future__ import annotations

import torch
from torch import nn

import attnaudit
from attnaudit.capturing.views import prompt_views
from attnaudit.record import Role

B, T, P, D = 2, 6, 3, 4  # batch, positions, prompt length, value size
RAMP = torch.arange(1.0, T - P + 2)  # self-view keys P-1 .. T-1


class CausalSoftmax(nn.Module):
    """One causal attention read: (B, 1, T, T) scores -> (B, 1, T, D) context."""

    def forward(self, scores: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        return torch.softmax(scores.masked_fill(~causal, float("-inf")), -1) @ values


def both_views(site, weights, key_mask):
    if site.kind == "cross":  # uniform over the prompt keys
        return torch.full_like(weights, 1.0 / weights.shape[-1])
    tilted = weights * RAMP[: weights.shape[-1]]
    return tilted / tilted.sum(-1, keepdim=True)


def hand_edited(weights: torch.Tensor) -> torch.Tensor:
    """The views' rule written out on raw weights (B, 1, T, T), rows P-1 .. T-1."""
    rows = slice(P - 1, None)
    out = weights.clone()
    total = weights[:, :, rows].sum(-1, keepdim=True)
    cross_mass = weights[:, :, rows, :P].sum(-1, keepdim=True)
    out[:, :, rows, :P] = (1.0 / P) * cross_mass / total
    self_block = out[:, :, rows, P - 1:]  # read after the cross view was written
    self_mass = self_block.sum(-1, keepdim=True)
    view = self_block / self_mass * out[:, :, rows].sum(-1, keepdim=True)
    tilted = view * RAMP
    out[:, :, rows, P - 1:] = tilted / tilted.sum(-1, keepdim=True) * self_mass / total
    return out


def test_editing_both_views_of_one_call_equals_the_hand_written_run():
    torch.manual_seed(0)
    model = CausalSoftmax()
    scores, values = torch.randn(B, 1, T, T, dtype=torch.float64), torch.randn(B, 1, T, D,
                                                                               dtype=torch.float64)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    raw = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1)
    with prompt_views(P), attnaudit.capture(model, edit=both_views) as cap:
        out = model(scores, values)
    assert sorted(cap.records) == ["forward:cross", "forward:self"]
    expected = hand_edited(raw)
    torch.testing.assert_close(out, expected @ values, rtol=0, atol=1e-6)
    assert not torch.allclose(expected, raw)  # the edits did change the weights
    # the self view was recorded as read after the cross view was written
    self_view = cap.records["forward:self"].weights
    block = hand_edited_cross_only(raw)[:, :, P - 1:, P - 1:]
    torch.testing.assert_close(self_view, block / block.sum(-1, keepdim=True), rtol=0,
                               atol=1e-6)


def hand_edited_cross_only(weights: torch.Tensor) -> torch.Tensor:
    rows = slice(P - 1, None)
    out = weights.clone()
    cross_mass = weights[:, :, rows, :P].sum(-1, keepdim=True)
    out[:, :, rows, :P] = (1.0 / P) * cross_mass / weights[:, :, rows].sum(-1, keepdim=True)
    return out


def test_view_records_carry_their_role_and_the_block_is_passed_not_kept():
    torch.manual_seed(0)
    model = CausalSoftmax()
    scores, values = torch.randn(B, 1, T, T), torch.randn(B, 1, T, D)
    with attnaudit.capture(model) as cap:
        with prompt_views(P) as outer:
            with prompt_views(P - 1) as inner:  # the innermost block is the one in force
                model(scores, values)
            assert inner.runs and not outer.runs  # each block's runs are its own
            model(scores, values)
        model(scores, values)  # outside every block: the raw weights
    roles = {name: record.site.role for name, record in cap.records.items()}
    assert roles == {"forward:cross": Role.PROMPT, "forward:self": Role.CONTINUATION,
                     "forward": None}
    assert (Role.PROMPT, Role.CONTINUATION) == ("cross", "decoder_self")
    # queries P-2.. from the inner block, then P-1.. from the outer one
    assert cap.records["forward:cross"].weights.shape[2] == (T - P + 2) + (T - P + 1)
    assert cap.records["forward"].weights.shape[2] == T
