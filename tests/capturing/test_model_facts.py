"""Model facts as data, the user first: a capture's ``include`` / ``exclude`` / ``roles``
beat the table of model facts, which beats the generic rules. Attention in a module whose
names no rule reads as attention is captured when the user includes it (and not without);
a router the rules read as attention is set right by ``exclude`` alone; an explicit role
beats the cross-attention name words; an entry registered for a toy ``model_type`` is
applied and removed again. Weights are held to a softmax written by hand in float64. Every
generic heuristic that reads names says which code it serves, and its test fails without it.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import torch
from torch import nn

import attnaudit
from attnaudit.capturing import model_facts
from attnaudit.capturing.model_facts import (
    HEURISTICS,
    ModelFacts,
    register_model_facts,
    unregister_model_facts,
)
from attnaudit.capturing.roles import ROLE_RULES, routes_or_mixes
from attnaudit.capturing.views import prompt_views
from attnaudit.errors import CaptureError, CaptureOptionError, NoAttentionFound
from attnaudit.targets.hf.own_input import OwnInput, own_input

B, H, T, D, E = 2, 2, 6, 8, 6  # batch, heads, tokens, width, experts (as many as tokens)
ROOT = Path(__file__).resolve().parents[2]


def by_hand(x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, heads: int = H,
            causal: bool = True) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d)) per head in float64, written out: (B, heads, T, T)."""
    x, w_q, w_k = x.double(), w_q.double(), w_k.double()
    d = w_q.shape[0] // heads
    q = (x @ w_q.T).view(x.shape[0], -1, heads, d).transpose(1, 2)
    k = (x @ w_k.T).view(x.shape[0], -1, heads, d).transpose(1, 2)
    scores = q @ k.transpose(-1, -2) / d ** 0.5
    if causal:
        n = x.shape[1]
        scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    e = torch.exp(scores - scores.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


class Mixer(nn.Module):
    """Causal softmax(Q K^T) V attention over (B, H, T, T), its values from experts of its
    own (a mixture of value heads): the experts rule reads it as a router."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(D, D, bias=False)
        self.k = nn.Linear(D, D, bias=False)
        self.experts = nn.ModuleList(nn.Linear(D, D, bias=False) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k = (f(x).view(*x.shape[:2], H, D // H).transpose(1, 2) for f in (self.q, self.k))
        v = sum(e(x) for e in self.experts).view(*x.shape[:2], H, D // H).transpose(1, 2)
        causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()
        scores = (q @ k.transpose(-1, -2) / (D // H) ** 0.5).masked_fill(~causal,
                                                                        float("-inf"))
        return (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(x.shape)


class AttentionRouter(nn.Module):
    """Routes each token to one of E experts (attention-head experts, hence its class name,
    which the rules read as attention): (B, T, E), as many experts as tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(E, D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x @ self.weight.T, dim=-1)


class Config:
    model_type = "toy_blend"


class Blended(nn.Module):
    """A decoder layer: Mixer attention at ``blend``, then a routed feed-forward."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.config = Config()
        self.blend = Mixer()
        self.head_router = AttentionRouter()
        self.out = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.blend(x)
        return h + self.head_router(h) @ torch.ones(E, D) * self.out(h)


def expected_blend(model: Blended, x: torch.Tensor) -> torch.Tensor:
    return by_hand(x, model.blend.q.weight.detach(), model.blend.k.weight.detach())


@pytest.fixture
def blended() -> tuple[Blended, torch.Tensor]:
    model = Blended().eval()
    return model, torch.randn(B, T, D, generator=torch.Generator().manual_seed(1))


def run(model: nn.Module, x: torch.Tensor, **options) -> attnaudit.Capture:
    with torch.no_grad(), attnaudit.capture(model, **options) as cap:
        model(x)
    return cap


def test_attention_no_rule_reads_is_captured_when_included_and_not_without(blended):
    model, x = blended
    assert run(model, x).sites == ["head_router"]  # the rules: Mixer routes, the router attends
    for include in ("blend", "*blend", "Mixer"):
        cap = run(model, x, include=include)
        assert cap.sites == ["blend", "head_router"]
        torch.testing.assert_close(cap.records["blend"].weights.double(),
                                   expected_blend(model, x), rtol=0, atol=1e-6)


def test_a_router_the_rules_read_as_attention_is_set_right_by_exclude_alone(blended):
    model, x = blended
    with torch.no_grad():
        plain = model(x)
    cap = run(model, x, include="blend", exclude="*router")
    assert cap.sites == ["blend"]
    torch.testing.assert_close(cap.records["blend"].weights.double(), expected_blend(model, x),
                               rtol=0, atol=1e-6)
    with pytest.raises(NoAttentionFound):
        run(model, x, exclude=["*router"])  # nothing else is attention by the rules
    with torch.no_grad(), attnaudit.capture(model, include="blend", exclude="*router"):
        torch.testing.assert_close(model(x), plain, rtol=0, atol=0)  # the router still runs


def test_exclude_beats_include_and_reaches_multi_head_attention_modules():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(D, H, dim_feedforward=16, batch_first=True).eval()
    x = torch.randn(B, T, D)
    assert run(layer, x).sites == ["self_attn:self"]
    with pytest.raises(NoAttentionFound):
        run(layer, x, exclude="self_attn", include="self_attn")
    with pytest.raises(NoAttentionFound):
        run(layer, x, exclude="MultiheadAttention")


class SharedAttention(nn.Module):
    """Causal self-attention shared across layers; its name says "cross" (across layers)."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(D, D, bias=False)
        self.k = nn.Linear(D, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k = (f(x).view(*x.shape[:2], H, D // H).transpose(1, 2) for f in (self.q, self.k))
        causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()
        scores = (q @ k.transpose(-1, -2) / (D // H) ** 0.5).masked_fill(~causal,
                                                                        float("-inf"))
        return (torch.softmax(scores, -1) @ q).transpose(1, 2).reshape(x.shape)


class CrossLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.config = Config()
        self.cross_layer_attn = SharedAttention()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cross_layer_attn(self.cross_layer_attn(x))


def test_an_explicit_role_beats_the_cross_attention_words():
    model = CrossLayer().eval()
    x = torch.randn(B, T, D)
    assert run(model, x).sites == ["cross_layer_attn:cross"]  # the word list's guess
    cap = run(model, x, roles={"*layer_attn": "self"})
    assert cap.sites == ["cross_layer_attn:self"]
    rec = cap.records["cross_layer_attn:self"]
    assert len(rec.calls) == 2
    w = model.cross_layer_attn.q.weight.detach(), model.cross_layer_attn.k.weight.detach()
    torch.testing.assert_close(rec.calls[0].weights.double(), by_hand(x, *w), rtol=0,
                               atol=1e-6)
    with pytest.raises(CaptureOptionError, match="'self' or 'cross'"):
        attnaudit.capture(model, roles={"*": "router"})


def test_a_registered_entry_is_applied_and_removed(blended):
    model, x = blended
    entry = ModelFacts("toy_blend", serves="the toy Blended decoder of this test",
                       attention=("*blend",), not_attention=("*_router",),
                       kinds={"blend": "self"})
    register_model_facts(entry)
    try:
        assert model_facts.model_facts("toy_blend") is entry
        cap = run(model, x)
        assert cap.sites == ["blend:self"]
        torch.testing.assert_close(cap.records["blend:self"].weights.double(),
                                   expected_blend(model, x), rtol=0, atol=1e-6)
        with pytest.raises(CaptureError, match="already registered"):
            register_model_facts(entry)
    finally:
        assert unregister_model_facts("toy_blend") is entry
    assert model_facts.model_facts("toy_blend") is None
    assert run(model, x).sites == ["head_router"]


def test_an_entry_is_also_found_by_the_model_class_name(blended):
    model, x = blended
    register_model_facts(ModelFacts("Blended", serves="this test's toy", attention=("blend",)))
    try:
        assert run(model, x).sites == ["blend", "head_router"]
    finally:
        unregister_model_facts("Blended")


def test_the_override_beats_the_entry_which_beats_the_rules(blended):
    model, x = blended
    register_model_facts(ModelFacts("toy_blend", serves="this test's toy",
                                    attention=("*blend",), kinds={"blend": "cross"}))
    try:
        assert run(model, x).sites == ["blend:cross", "head_router"]  # entry beats rules
        assert run(model, x, exclude="blend").sites == ["head_router"]  # user beats entry
        cap = run(model, x, roles={"blend": "self"})
        assert cap.sites == ["blend:self", "head_router"]
        torch.testing.assert_close(cap.records["blend:self"].weights.double(),
                                   expected_blend(model, x), rtol=0, atol=1e-6)
        assert run(model, x, kinds={"blend": "self"}).sites == ["blend:self", "head_router"]
    finally:
        unregister_model_facts("toy_blend")
    model.config = None  # no entry: the rules alone, whatever the override elsewhere says
    assert run(model, x, exclude="nothing*").sites == ["head_router"]


def test_an_entrys_kind_beats_the_cross_attention_words():
    model = CrossLayer().eval()
    x = torch.randn(B, T, D)
    register_model_facts(ModelFacts("toy_blend", serves="this test's toy",
                                    kinds={"cross_layer_attn": "self"}))
    try:
        assert run(model, x).sites == ["cross_layer_attn:self"]
    finally:
        unregister_model_facts("toy_blend")


def test_own_input_reads_the_table():
    class LeadConfig:
        model_type = "toy_lead"
        prefix_len = 3

    class LeadModel(nn.Module):
        config = LeadConfig()

    assert own_input(LeadModel()) == OwnInput()
    register_model_facts(ModelFacts("toy_lead", serves="this test's toy", lead="prefix_len",
                                    pad_id=5, whole_ids_per_step=True))
    try:
        assert own_input(LeadModel()) == OwnInput(pad_id=5, lead=3, whole_ids_per_step=True)
        LeadConfig.prefix_len = None  # type: ignore[assignment]
        with pytest.raises(CaptureError, match=r"config\.prefix_len"):
            own_input(LeadModel())
    finally:
        unregister_model_facts("toy_lead")
    assert model_facts.model_facts("cpmant").pad_id == 0  # the built-in CPM-Ant entry


def test_an_entry_must_say_which_code_it_serves():
    with pytest.raises(CaptureError, match="serves"):
        ModelFacts("toy", serves=" ")
    with pytest.raises(CaptureError, match="lead"):
        ModelFacts("toy", serves="x", lead=-1)


# --- every generic heuristic that reads names: which code it serves, and its test -------

def _example(cls: str, experts: bool) -> nn.Module:
    module = type(cls, (nn.Module,), {})()
    if experts:
        module.experts = nn.ModuleList([nn.Linear(1, 1)])
    return module


@pytest.mark.parametrize("rule", ROLE_RULES, ids=[r.name for r in ROLE_RULES])
def test_every_role_rule_decides_its_own_example(rule):
    cls, path, function, experts = rule.example
    module = _example(cls, experts)
    assert routes_or_mixes(module, path, function) is not rule.attention
    others = [r for r in ROLE_RULES if r is not rule]
    assert routes_or_mixes(module, path, function, others) is rule.attention, \
        f"{rule.name} is not needed for its example"
    assert rule.serves


@pytest.mark.parametrize("heuristic", HEURISTICS, ids=[h.name for h in HEURISTICS])
def test_every_heuristic_names_its_code_and_an_existing_test(heuristic):
    module, symbol = heuristic.where.split(":")
    assert hasattr(importlib.import_module(module), symbol)
    path, function = heuristic.test.split("::")
    source = (ROOT / path).read_text()
    assert re.search(rf"^def {re.escape(function)}\(", source, re.M), heuristic.test
    assert heuristic.serves


class KeyValueAttention(nn.Module):
    """A Hugging Face style attention forward: ``is_cross_attention`` from its input."""

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None) -> torch.Tensor:
        is_cross_attention = memory is not None  # noqa: F841 (read off the frame by capture)
        keys = x if memory is None else memory
        return torch.softmax(x @ keys.transpose(-1, -2), -1) @ keys


class TwoMixes(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mix = KeyValueAttention()
        self.mix_memory = KeyValueAttention()

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        return self.mix_memory(self.mix(x), memory)


def test_the_is_cross_attention_local_gives_the_kind():
    model = TwoMixes()
    x, memory = torch.randn(B, T, D), torch.randn(B, T + 1, D)
    with torch.no_grad(), attnaudit.capture(model) as cap:
        model(x, memory)
    assert cap.sites == ["mix:self", "mix_memory:cross"]  # no name says either
    queries = torch.softmax(x.double() @ x.double().transpose(-1, -2), -1) @ x.double()
    scores = queries @ memory.double().transpose(-1, -2)
    expected = torch.exp(scores - scores.amax(-1, keepdim=True))
    expected = expected / expected.sum(-1, keepdim=True)
    torch.testing.assert_close(cap.records["mix_memory:cross"].weights[:, 0].double(),
                               expected, rtol=0, atol=1e-5)


class FoldedHeads(nn.Module):
    """Softmax over (B * H, T, T), heads folded batch-major as fairseq folds them."""

    def __init__(self, state_heads: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q = nn.Linear(D, D, bias=False)
        self.k = nn.Linear(D, D, bias=False)
        if state_heads:
            self.n_heads = H

    def fold(self, t: torch.Tensor) -> torch.Tensor:
        return t.view(t.shape[0], T, H, D // H).transpose(1, 2).reshape(-1, T, D // H)

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        q, k = self.fold(self.q(x)), self.fold(self.k(x))
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        return (q @ k.transpose(1, 2) / (D // H) ** 0.5).masked_fill(~causal, float("-inf"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.scores(x), -1)


class NamedFoldedHeads(FoldedHeads):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bsz, num_heads = x.shape[0], H  # what the frame knows: the fold's sizes
        assert bsz * num_heads
        return torch.softmax(self.scores(x), -1)


def _folded(model: FoldedHeads) -> None:
    x = torch.randn(B, T, D)
    with torch.no_grad(), attnaudit.capture(model) as cap:
        model(x)
    rec = cap.records["forward"]
    assert rec.site.layout == "(b h) q k" and rec.site.layout_source == "inferred"
    torch.testing.assert_close(rec.weights.double(),
                               by_hand(x, model.q.weight.detach(), model.k.weight.detach()),
                               rtol=0, atol=1e-6)


def test_layout_names_at_the_call_site_unfold_heads():
    _folded(NamedFoldedHeads(False))


def test_a_module_head_count_unfolds_heads():
    _folded(FoldedHeads(True))


transformers = pytest.importorskip("transformers")


def tiny_llama(backend: str) -> nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=4, max_position_embeddings=32,
        attn_implementation=backend)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def test_a_packed_grouped_query_step_is_one_query():
    # with a mask (a left-padded row), transformers' SDPA step packs the query heads of each
    # key/value head onto the query axis: its rows are heads, not positions, also when a
    # small memory budget computes it in blocks of rows, and prompt views cut its keys
    model, eager = tiny_llama("sdpa"), tiny_llama("eager")
    ids = torch.randint(3, 50, (2, T), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    prompt = T - 2
    with torch.no_grad():
        cache = model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1],
                      use_cache=True).past_key_values
        truth = eager(input_ids=ids, attention_mask=mask,
                      output_attentions=True).attentions[0][:, :, -1:].double()
        with prompt_views(prompt), attnaudit.capture(model, max_memory=1024) as cap:
            model(input_ids=ids[:, -1:], attention_mask=mask, past_key_values=cache,
                  use_cache=True)
    view = cap.records["model.layers.0.self_attn:cross"]
    assert view.weights.shape == (2, 4, 1, prompt)
    expected = truth[..., :prompt] / truth[..., :prompt].sum(-1, keepdim=True)
    torch.testing.assert_close(view.weights.double(), expected, rtol=0, atol=1e-5)


def test_sampling_softmaxes_are_not_sites():
    model = tiny_llama("eager")
    ids = torch.randint(3, 50, (1, 3))
    with torch.no_grad(), attnaudit.capture(model) as cap:
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                       max_new_tokens=2, pad_token_id=0)
    assert cap.sites == ["model.layers.0.self_attn:self"]
