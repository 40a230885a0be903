"""Capture in the layouts real codebases use: heads folded into the batch, every decoder step
folded into the batch, a softmax over a non-last axis, ``F.multi_head_attention_forward``
called directly. Ground truth comes from the same attention written out by hand with the
module's parameters, in ``(batch, heads, queries, keys)``.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import attnaudit

D, HEADS = 16, 4


def uniform_rows(weights: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
    """Uniform weights over each row's eligible keys (every key when there is no mask)."""
    eligible = (torch.ones_like(weights) if key_mask is None
                else key_mask.expand_as(weights).to(weights.dtype))
    return eligible / eligible.sum(-1, keepdim=True)


def uniform_edit(site, weights, key_mask):
    return uniform_rows(weights, key_mask)


def head0_uniform_edit(site, weights, key_mask):
    edited = weights.clone()
    edited[:, 0] = uniform_rows(weights, key_mask)[:, 0]
    return edited


class FoldedAttention(nn.Module):
    """Multi-head attention computed on ``(batch * heads, queries, keys)`` tensors, the way
    fairseq, LED and many research codebases write it, with opaque local names. ``says``:
    ``attr`` gives the module a ``num_heads`` attribute; ``nothing`` hides the head count."""

    def __init__(self, says: str = "attr") -> None:
        super().__init__()
        if says == "attr":
            self.num_heads = HEADS
        self._width = HEADS
        self.q, self.k, self.v = (nn.Linear(D, D) for _ in range(3))
        self.o = nn.Linear(D, D)

    def fold(self, proj: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B * H, T, D / H), batch-major."""
        n_, t_, _ = x.shape
        return proj(x).view(n_, t_, self._width, -1).transpose(1, 2).reshape(n_ * self._width,
                                                                              t_, -1)

    def unfold(self, out: torch.Tensor, n_: int) -> torch.Tensor:
        """(B * H, T, D / H) -> (B, T, D) through the output projection."""
        return self.o(out.view(n_, self._width, out.shape[1], -1).transpose(1, 2)
                      .reshape(n_, out.shape[1], D))

    def forward(self, x: torch.Tensor, memory: torch.Tensor,
                allowed: torch.Tensor) -> torch.Tensor:
        """x (B, T, D), memory (B, S, D), allowed (B, T, S) bool -> (B, T, D)."""
        q, k, v = self.fold(self.q, x), self.fold(self.k, memory), self.fold(self.v, memory)
        scores = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(~allowed.repeat_interleave(self._width, 0), float("-inf"))
        return self.unfold(torch.bmm(scores.softmax(-1), v), x.shape[0])


class FairseqStyleAttention(FoldedAttention):
    """The same, with the head count and batch size in locals named as fairseq names them,
    and no head-count attribute."""

    def __init__(self) -> None:
        super().__init__("nothing")

    def forward(self, x: torch.Tensor, memory: torch.Tensor,
                allowed: torch.Tensor) -> torch.Tensor:
        bsz, num_heads = x.shape[0], self._width
        q, k, v = self.fold(self.q, x), self.fold(self.k, memory), self.fold(self.v, memory)
        scores = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(~allowed.repeat_interleave(num_heads, 0), float("-inf"))
        return self.unfold(F.softmax(scores, dim=-1) @ v, bsz)


def folded_reference(module: FoldedAttention, x, memory, allowed, uniform_heads=()):
    """The same attention written in (B, H, T, S) with einsum; heads in ``uniform_heads``
    get uniform weights over their allowed keys. Returns weights and output."""
    b, t, _ = x.shape
    s = memory.shape[1]
    dh = D // HEADS
    q = module.q(x).view(b, t, HEADS, dh).permute(0, 2, 1, 3)
    k = module.k(memory).view(b, s, HEADS, dh).permute(0, 2, 1, 3)
    v = module.v(memory).view(b, s, HEADS, dh).permute(0, 2, 1, 3)
    scores = torch.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(dh)
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    e = torch.exp(scores - scores.amax(-1, keepdim=True))
    weights = e / e.sum(-1, keepdim=True)
    for h in uniform_heads:
        weights[:, h] = uniform_rows(weights[:, h], allowed)
    out = torch.einsum("bhts,bhsd->bhtd", weights, v).permute(0, 2, 1, 3).reshape(b, t, D)
    return weights, module.o(out)


def cross_inputs(seed: int = 0):
    torch.manual_seed(seed)
    x, memory = torch.randn(3, 5, D), torch.randn(3, 7, D)
    allowed = torch.ones(3, 5, 7, dtype=torch.bool)
    allowed[1, :, 4:] = False
    allowed[2, :, 6:] = False
    return x, memory, allowed


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("make", [FoldedAttention, FairseqStyleAttention])
def test_folded_heads_are_unfolded(make, grad):
    torch.manual_seed(0)
    module = make()
    x, memory, allowed = cross_inputs()
    with torch.set_grad_enabled(grad):
        with attnaudit.capture(module) as cap:
            out = module(x, memory, allowed)
        ref_w, ref_out = folded_reference(module, x, memory, allowed)
    (rec,) = cap.records.values()
    assert rec.weights.shape == (3, HEADS, 5, 7)
    assert (rec.weights - ref_w).abs().max().item() <= 1e-5
    assert (out - ref_out).abs().max().item() <= 1e-5
    assert torch.equal(rec.key_mask.expand(3, HEADS, 5, 7), allowed[:, None].expand(3, HEADS, 5, 7))
    assert (rec.site.layout, rec.site.layout_source) == ("(b h) q k", "inferred")


def test_folded_heads_need_a_statement_when_nothing_says_them():
    torch.manual_seed(0)
    module = FoldedAttention("nothing")
    x, memory, allowed = cross_inputs()
    with torch.no_grad(), attnaudit.capture(module) as cap:
        module(x, memory, allowed)
    (rec,) = cap.records.values()
    # Nothing at the call site names a head count: the record says its layout is a default.
    assert rec.weights.shape == (3 * HEADS, 1, 5, 7)
    assert (rec.site.layout, rec.site.layout_source) == ("b q k", "default")
    with torch.no_grad(), attnaudit.capture(module, heads={"forward": HEADS}) as cap:
        module(x, memory, allowed)
    (rec,) = cap.records.values()
    ref_w, _ = folded_reference(module, x, memory, allowed)
    assert (rec.weights - ref_w).abs().max().item() <= 1e-5
    assert (rec.site.layout, rec.site.layout_source) == ("(b h) q k", "stated")


def test_stated_heads_that_do_not_divide_the_batch_axis_are_refused():
    module = FoldedAttention("nothing")
    x, memory, allowed = cross_inputs()
    with pytest.raises(attnaudit.CaptureError, match="head count 5 does not divide"), \
            torch.no_grad(), attnaudit.capture(module, heads={"forward": 5}):
        module(x, memory, allowed)


@pytest.mark.parametrize(("edit", "uniform_heads"), [(head0_uniform_edit, (0,)),
                                                     (uniform_edit, tuple(range(HEADS)))])
def test_edits_on_folded_heads_land_on_the_right_head(edit, uniform_heads):
    torch.manual_seed(0)
    module = FoldedAttention()
    x, memory, allowed = cross_inputs()
    with torch.no_grad():
        with attnaudit.capture(module, edit=edit):
            out = module(x, memory, allowed)
        _, ref_out = folded_reference(module, x, memory, allowed, uniform_heads=uniform_heads)
        _, untouched = folded_reference(module, x, memory, allowed)
    assert (out - ref_out).abs().max().item() <= 1e-5
    assert (out - untouched).abs().max().item() > 1e-3  # the edit did something


def test_folded_self_attention_in_a_decoding_loop_with_a_growing_cache():
    """Step t attends over keys 0..t (a growing cache); the record stacks the steps on the
    query axis and pads the keys, so it equals causal full-sequence attention."""
    torch.manual_seed(0)
    module = FairseqStyleAttention()
    x = torch.randn(2, 6, D)
    with torch.no_grad():
        with attnaudit.capture(module) as cap:
            for t in range(6):
                module(x[:, t:t + 1], x[:, : t + 1], torch.ones(2, 1, t + 1, dtype=torch.bool))
        causal = torch.ones(6, 6, dtype=torch.bool).tril().expand(2, 6, 6)
        ref_w, _ = folded_reference(module, x, x, causal)
    (rec,) = cap.records.values()
    assert rec.weights.shape == (2, HEADS, 6, 6)
    assert len(rec.calls) == 6
    assert (rec.weights - ref_w).abs().max().item() <= 1e-5
    assert torch.equal(rec.key_mask.expand(2, HEADS, 6, 6)[0, 0], causal[0])


class GlobalAttention(nn.Module):
    """OpenNMT-style global attention over every decoder step at once: the softmax runs on
    ``(batch * target_len, source_len)``."""

    def __init__(self) -> None:
        super().__init__()
        self.linear_in = nn.Linear(D, D, bias=False)

    def forward(self, source: torch.Tensor, memory_bank: torch.Tensor,
                memory_mask: torch.Tensor) -> torch.Tensor:
        """source (B, T, D), memory_bank (B, S, D), memory_mask (B, S) bool -> (B, T, D)."""
        batch, target_l, _ = source.size()
        source_l = memory_bank.size(1)
        align = torch.bmm(self.linear_in(source), memory_bank.transpose(1, 2))
        align = align.masked_fill(~memory_mask[:, None, :], -float("inf"))
        align_vectors = F.softmax(align.view(batch * target_l, source_l), -1)
        return torch.bmm(align_vectors.view(batch, target_l, source_l), memory_bank)


@pytest.mark.parametrize("grad", [False, True])
def test_every_step_folded_into_the_batch(grad):
    torch.manual_seed(0)
    module = GlobalAttention()
    source, memory = torch.randn(3, 4, D), torch.randn(3, 6, D)
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[0, 3:] = False
    with torch.set_grad_enabled(grad):
        with attnaudit.capture(module) as cap:
            module(source, memory, mask)
        scores = torch.einsum("btd,bsd->bts", module.linear_in(source), memory)
        ref = torch.softmax(scores.masked_fill(~mask[:, None], float("-inf")), -1)
    (rec,) = cap.records.values()
    assert rec.weights.shape == (3, 1, 4, 6)  # one query row per decoder step
    assert (rec.weights[:, 0] - ref).abs().max().item() <= 1e-5
    assert (rec.site.layout, rec.site.layout_source) == ("(b q) k", "inferred")
    with torch.no_grad(), attnaudit.capture(module, edit=uniform_edit):
        out = module(source, memory, mask)
    expected = (mask[:, None].float() / mask.sum(-1)[:, None, None]) @ memory
    assert (out - expected).abs().max().item() <= 1e-5
    # The same module decoding one step at a time: (batch * 1, S) per call, stacked by step.
    with torch.no_grad(), attnaudit.capture(module) as steps:
        for t in range(4):
            module(source[:, t:t + 1], memory, mask)
    (stacked,) = steps.records.values()
    assert len(stacked.calls) == 4
    assert (stacked.weights[:, 0] - ref).abs().max().item() <= 1e-5


class SeqFirstAdditive(nn.Module):
    """Bahdanau attention scored as ``(source_len, batch)`` and normalised over dim 0."""

    def __init__(self) -> None:
        super().__init__()
        self.w, self.u = nn.Linear(D, D), nn.Linear(D, D)
        self.v = nn.Linear(D, 1, bias=False)
        self.cell = nn.GRUCell(D, D)

    def attend(self, hidden: torch.Tensor, encoder_outputs: torch.Tensor,
               mask: torch.Tensor) -> torch.Tensor:
        """hidden (B, D), encoder_outputs (S, B, D), mask (S, B) -> context (B, D)."""
        energy = self.v(torch.tanh(self.w(encoder_outputs) + self.u(hidden)[None])).squeeze(-1)
        a = F.softmax(energy.masked_fill(~mask, float("-inf")), dim=0)
        return (a.unsqueeze(-1) * encoder_outputs).sum(0)

    def forward(self, encoder_outputs: torch.Tensor, mask: torch.Tensor,
                steps: int) -> torch.Tensor:
        hidden = encoder_outputs.mean(0)
        outputs = []
        for _ in range(steps):
            hidden = self.cell(self.attend(hidden, encoder_outputs, mask), hidden)
            outputs.append(hidden)
        return torch.stack(outputs, 1)


def seq_first_reference(model: SeqFirstAdditive, enc, mask, steps, uniform=False):
    """Weights (B, T, S) and outputs (B, T, D), batch-first and by hand."""
    enc_b = enc.transpose(0, 1)  # (B, S, D)
    valid = mask.T  # (B, S)
    hidden = enc.mean(0)
    weights, outputs = [], []
    for _ in range(steps):
        if uniform:
            w = valid.float() / valid.sum(-1, keepdim=True)
        else:
            energy = (torch.tanh(model.w(enc_b) + model.u(hidden)[:, None]) @ model.v.weight.T)
            e = energy.squeeze(-1).masked_fill(~valid, float("-inf"))
            w = torch.exp(e - e.amax(-1, keepdim=True))
            w = w / w.sum(-1, keepdim=True)
        hidden = model.cell((w[..., None] * enc_b).sum(1), hidden)
        weights.append(w)
        outputs.append(hidden)
    return torch.stack(weights, 1), torch.stack(outputs, 1)


def test_softmax_over_the_first_axis_takes_it_as_the_keys():
    torch.manual_seed(0)
    model = SeqFirstAdditive()
    enc = torch.randn(6, 3, D)  # (S, B, D)
    mask = torch.ones(6, 3, dtype=torch.bool)
    mask[4:, 1] = False
    with torch.no_grad():
        with attnaudit.capture(model) as cap:
            model(enc, mask, steps=4)
        ref_w, _ = seq_first_reference(model, enc, mask, 4)
        with attnaudit.capture(model, edit=uniform_edit):
            out = model(enc, mask, steps=4)
        _, ref_out = seq_first_reference(model, enc, mask, 4, uniform=True)
    rec = cap.records["attend"]
    assert rec.weights.shape == (3, 1, 4, 6)
    assert (rec.weights[:, 0] - ref_w).abs().max().item() <= 1e-5
    assert not rec.key_mask.expand(3, 1, 4, 6)[1, 0, :, 4:].any()
    assert rec.site.layout == "k b"
    assert (out - ref_out).abs().max().item() <= 1e-5


class FunctionalMHA(nn.Module):
    """Calls ``F.multi_head_attention_forward`` directly, asking for per-head weights."""

    def __init__(self) -> None:
        super().__init__()
        self.in_proj_weight = nn.Parameter(torch.randn(3 * D, D) / 4)
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * D))
        self.out_proj = nn.Linear(D, D)
        self.width = HEADS

    def forward(self, query, key, value, key_padding_mask):
        return F.multi_head_attention_forward(
            query, key, value, D, self.width, self.in_proj_weight, self.in_proj_bias,
            None, None, False, 0.0, self.out_proj.weight, self.out_proj.bias,
            training=self.training, key_padding_mask=key_padding_mask, need_weights=True,
            average_attn_weights=False)


@pytest.mark.parametrize("grad", [False, True])
def test_direct_functional_multi_head_attention(grad):
    torch.manual_seed(0)
    module = FunctionalMHA().eval()
    query, memory = torch.randn(5, 3, D), torch.randn(7, 3, D)  # (L, B, D), seq-first
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[2, 5:] = True
    with torch.set_grad_enabled(grad), attnaudit.capture(module) as cap:
        _, returned = module(query, memory, memory, pad)
    (rec,) = cap.records.values()
    assert returned.shape == rec.weights.shape == (3, HEADS, 5, 7)
    assert (rec.weights - returned.detach()).abs().max().item() <= 1e-6
    assert (rec.site.layout, rec.site.layout_source) == ("(b h) q k", "call")
    with torch.no_grad(), attnaudit.capture(module, edit=head0_uniform_edit) as cap:
        out, _ = module(query, memory, memory, pad)
    # By hand: head 0 reads the mean of its eligible values, the other heads as before.
    with torch.no_grad():
        v = F.linear(memory, module.in_proj_weight[2 * D:], module.in_proj_bias[2 * D:])
        v = v.view(7, 3, HEADS, D // HEADS).permute(1, 2, 0, 3)  # (B, H, S, dh)
        weights = returned.detach().clone()
        weights[:, 0] = uniform_rows(weights[:, 0], ~pad[:, None, :])
        heads = torch.einsum("bhls,bhsd->bhld", weights, v)
        expected = module.out_proj(heads.permute(2, 0, 1, 3).reshape(5, 3, D))
    assert (out - expected).abs().max().item() <= 1e-5
