"""Each non-attention softmax of the role tests recognised by exactly one rule.

``test_attention_roles.py``'s router (class ``Router`` at ``router``), MoE block
(``ToyMoeBlock`` at ``moe``, holding experts) and stream mixer (``StreamHyperConnection``
at ``hc``) are each recognised by two or three rules at once, so any one rule could be lost
unnoticed there. Here each is rebuilt so that one rule alone recognises it, by its class
name, its own name or the experts it holds, the other names neutral; a decoder whose only
attention is computed by hand holds it, and capture must record the attention alone (the
mixer weighs as many items as the prompt has tokens, so by shape it looks like attention).
Each case also says, through ``routes_or_mixes`` with that one rule left out, that no
other rule would have caught it.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import attnaudit
from attnaudit.capturing.roles import ROLE_RULES, routes_or_mixes

T, D = 6, 8


class Mixer(nn.Module):
    """A softmax over T items at every position (routing, stream mixing): not attention."""

    def __init__(self, experts: bool = False) -> None:
        super().__init__()
        self.proj = nn.Linear(D, T, bias=False)
        if experts:
            self.experts = nn.ModuleList(nn.Linear(D, D) for _ in range(T))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(self.proj(x), -1)  # (B, T, T items)
        return probs @ torch.ones(T, D)


class HandAttention(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        scores = (x @ x.transpose(-1, -2)).masked_fill(~causal, float("-inf"))
        return torch.softmax(scores, -1) @ x


class Decoder(nn.Module):
    def __init__(self, mixer_name: str, mixer: nn.Module) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.attn = HandAttention()
        setattr(self, mixer_name, mixer)
        self.mixer_name = mixer_name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self, self.mixer_name)(self.attn(x))


# (rule, the mixer's class name, its name in the decoder, holds experts)
CASES = [
    ("router_class", "Router", "dispatch", False),
    ("router_class", "TopKGate", "dispatch", False),
    ("router_class", "ToyMoeBlock", "dispatch", False),
    ("router_class", "StreamHyperConnection", "dispatch", False),
    ("router_name", "Mixing", "router", False),
    ("router_name", "Mixing", "gate", False),
    ("router_name", "Mixing", "moe", False),
    ("router_name", "Mixing", "hc", False),
    ("experts", "Mixing", "dispatch", True),
]


@pytest.mark.parametrize(("rule", "cls", "name", "experts"), CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CASES])
def test_one_rule_alone_keeps_a_mixer_out_of_the_sites(rule, cls, name, experts):
    mixer = type(cls, (Mixer,), {})(experts)
    model = Decoder(name, mixer).eval()
    x = torch.randn(2, T, D)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    scores = (x @ x.transpose(-1, -2)).masked_fill(~causal, float("-inf"))
    expected = torch.softmax(scores, -1)
    with torch.no_grad(), attnaudit.capture(model) as cap:
        model(x)
    assert cap.sites == ["attn"]
    torch.testing.assert_close(cap.records["attn"].weights[:, 0], expected, rtol=0, atol=1e-6)
    others = [r for r in ROLE_RULES if r.name != rule]
    assert routes_or_mixes(mixer, name, "forward")
    assert not routes_or_mixes(mixer, name, "forward", others), \
        f"another rule than {rule} recognises {cls} at {name!r}"
