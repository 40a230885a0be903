"""Only attention is attention: routers over experts, softmaxes that mix residual streams
or layer outputs (over depth) and router losses are not sites, even with as many experts or
blocks as the prompt has tokens (where a router's (tokens, experts) softmax looks like
attention by shape), while attention modules that hold experts of their own still are.
Checked on hand-built decoders whose attention is computed by hand, and on tiny Mixtral /
Qwen2-MoE / OLMoE against their own eager ``output_attentions``, raw and as prompt views."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import attnaudit
from attnaudit.capturing.roles import routes_or_mixes
from attnaudit.capturing.views import prompt_views

T, D, E = 7, 8, 7  # prompt tokens, width, experts (as many as tokens)


class Router(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(E, D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x.reshape(-1, D) @ self.weight.T, dim=-1)  # (B*T, E)


class ToyMoeBlock(nn.Module):
    """Routes with its own softmax (as DBRX's FFN does) through a child named ``gate``."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(D, E, bias=False)
        self.experts = nn.ModuleList(nn.Linear(D, D) for _ in range(E))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = self.gate(x).softmax(-1)  # (B, T, E)
        outs = torch.stack([e(x) for e in self.experts], -1)  # (B, T, D, E)
        return (outs * probs[:, :, None, :]).sum(-1)


class StreamHyperConnection(nn.Module):
    """Mixes n residual streams with a softmax over streams (hyper-connection style)."""

    def __init__(self, streams: int = T) -> None:
        super().__init__()
        self.mix = nn.Parameter(torch.randn(streams, streams))

    def forward(self, streams: torch.Tensor) -> torch.Tensor:  # (B, n, T, D)
        weights = torch.softmax(self.mix, dim=-1)  # (n, n)
        return torch.einsum("mn,bntd->bmtd", weights, streams)


class MixtureOfAttentionHeads(nn.Module):
    """Attention that holds experts of its own (JetMoe's mixture of attention heads)."""

    def __init__(self) -> None:
        super().__init__()
        self.experts = nn.ModuleList(nn.Linear(D, D) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        scores = (x @ x.transpose(-1, -2)).masked_fill(~causal, float("-inf"))
        return torch.softmax(scores, -1)[:, None] @ self.experts[0](x)[:, None]


def load_balancing_loss(router_probs: torch.Tensor) -> torch.Tensor:
    return torch.softmax(torch.log(router_probs), -1).mean()


class RoutedDecoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.attn = MixtureOfAttentionHeads()
        self.router = Router()
        self.moe = ToyMoeBlock()
        self.hc = StreamHyperConnection()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.attn(x)[:, 0]
        routed = self.router(h)
        h = self.moe(h) + (routed.reshape(*h.shape[:2], E) @ torch.ones(E, D))
        mixed = self.hc(h[:, None].expand(-1, T, -1, -1))
        return mixed, load_balancing_loss(routed)


def test_routers_mixers_and_router_losses_are_not_sites_attention_with_experts_is():
    model = RoutedDecoder().eval()
    x = torch.randn(2, T, D)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    expected = torch.softmax((x @ x.transpose(-1, -2)).masked_fill(~causal, float("-inf")), -1)
    with torch.no_grad(), attnaudit.capture(model) as cap:
        model(x)
    assert cap.sites == ["attn"]
    torch.testing.assert_close(cap.records["attn"].weights[:, 0], expected, rtol=0, atol=1e-6)
    with torch.no_grad(), prompt_views(T - 2), attnaudit.capture(model) as views:
        model(x)
    assert list(views.records) == ["attn:cross", "attn:self"]  # no router cut into views
    rows = expected[:, T - 3:]
    cross = rows[..., : T - 2] / rows[..., : T - 2].sum(-1, keepdim=True)
    torch.testing.assert_close(views.records["attn:cross"].weights[:, 0], cross, rtol=0,
                               atol=1e-6)


H = 2  # heads of the depth-mixed decoder's token attention


def attend(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
           mask: torch.Tensor | None = None) -> torch.Tensor:
    """One attention function for every caller, as Hugging Face's ``eager_attention_forward``:
    (B, H, Q, d) queries over (B, H, K, d) keys and values."""
    scores = query @ key.transpose(-1, -2) / key.shape[-1] ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, -1) @ value


class TokenAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D, bias=False)
        self.num_heads = H

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, D)
        q, k, v = self.qkv(x).view(*x.shape[:2], 3, H, D // H).permute(2, 0, 3, 1, 4)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        return attend(self, q, k, v, causal).transpose(1, 2).reshape(x.shape)


class BlockAttentionResidual(nn.Module):
    """Attention residual: a learned query weighs the outputs of earlier blocks at every
    position, through the model's attention function (positions in the heads slot, blocks
    on the key axis)."""

    def __init__(self) -> None:
        super().__init__()
        self.query = nn.Parameter(torch.randn(D))

    def forward(self, blocks: torch.Tensor) -> torch.Tensor:  # (B, T, L, D) -> (B, T, D)
        query = self.query.expand(*blocks.shape[:2], 1, D)
        return attend(self, query, blocks, blocks)[:, :, 0]


def block_attn_res(blocks: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """(L, B, T, D) block outputs mixed by a softmax over depth (dim 0) -> (B, T, D)."""
    return torch.einsum("lbt,lbtd->btd", torch.softmax(blocks @ query, dim=0), blocks)


class DepthMixedDecoder(nn.Module):
    """T - 1 blocks, then token attention whose input and the final output are mixes of all
    block outputs by depth: T blocks, as many as the prompt has tokens."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(nn.Linear(D, D) for _ in range(T - 1))
        self.attention_input = BlockAttentionResidual()
        self.self_attn = TokenAttention()
        self.final_query = nn.Parameter(torch.randn(D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outputs = [x]
        for block in self.blocks:
            outputs.append(torch.tanh(block(outputs[-1])))
        h = self.self_attn(self.attention_input(torch.stack(outputs, 2)))
        return block_attn_res(torch.stack([*outputs[1:], h]), self.final_query)


def test_softmaxes_over_depth_are_not_sites_token_attention_is_captured_exactly():
    model = DepthMixedDecoder().eval()
    x = torch.randn(2, T, D)
    inputs: list[torch.Tensor] = []
    hook = model.self_attn.register_forward_hook(lambda _m, args, _o: inputs.append(args[0]))
    with torch.no_grad():
        model(x)
    hook.remove()
    w_q, w_k, _ = model.self_attn.qkv.weight.detach().split(D)  # (D, D) each
    q, k = ((inputs[0] @ w.T).view(2, T, H, D // H).transpose(1, 2) for w in (w_q, w_k))
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    expected = torch.softmax((q @ k.transpose(-1, -2) / (D // H) ** 0.5)
                             .masked_fill(~causal, float("-inf")), -1)  # (B, H, T, T)
    with torch.no_grad(), attnaudit.capture(model) as cap:
        model(x)
    assert cap.sites == ["self_attn:self"]
    torch.testing.assert_close(cap.records["self_attn:self"].weights, expected, rtol=0, atol=1e-6)
    with torch.no_grad(), prompt_views(T - 2), attnaudit.capture(model) as views:
        model(x)
    assert list(views.records) == ["self_attn:cross", "self_attn:self"]


@pytest.mark.parametrize(("cls", "path", "function", "mixes"), [
    ("FullAttention", "model.layers.0.self_attn", "eager_attention_forward", False),
    ("BlockAttentionResidual", "model.layers.1.attention_input", "eager_attention_forward",
     True),
    ("LoopBlockAttentionResidualsV2", "model.final_input", "sdpa_attention_forward", True),
    ("DecoderLayer", "model.layers.0.attn_res", "forward", True),
    ("DecoderLayer", "model.layers.0", "block_attn_res", True),
    ("DecoderLayer", "model.layers.0.resampler", "forward", False),  # no `res` part
    ("ImageFeatures", "model.vision.features", "forward", False),  # ends in "res", no role
])
def test_depth_mixing_is_read_off_class_path_and_function_names(cls, path, function, mixes):
    module = type(cls, (nn.Module,), {})()
    assert routes_or_mixes(module, path, function) is mixes


transformers = pytest.importorskip("transformers")

MOE = {  # model type: (config class, model class, expert-count argument)
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", "num_local_experts"),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", "num_experts"),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", "num_experts"),
}


def tiny_moe(name: str, backend: str) -> nn.Module:
    config_name, model_name, experts = MOE[name]
    config = getattr(transformers, config_name)(
        vocab_size=50, hidden_size=16, intermediate_size=32, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=4,
        max_position_embeddings=32, num_experts_per_tok=2, **{experts: T},
        attn_implementation=backend)
    torch.manual_seed(0)
    return getattr(transformers, model_name)(config).eval()


@pytest.mark.parametrize("name", list(MOE))
def test_moe_causal_lm_records_attention_only_and_equals_eager(name):
    model, truth_model = tiny_moe(name, "sdpa"), tiny_moe(name, "eager")
    torch.manual_seed(1)
    ids = torch.randint(3, 50, (2, T))
    with torch.no_grad():
        truth = truth_model(input_ids=ids, output_attentions=True).attentions
        with attnaudit.capture(model) as cap:
            model(input_ids=ids)
        with prompt_views(T - 3), attnaudit.capture(truth_model) as views:
            truth_model(input_ids=ids)
    layers = [f"model.layers.{i}.self_attn" for i in range(2)]
    assert cap.sites == [f"{layer}:self" for layer in layers]
    for rec, expected in zip(cap.records.values(), truth, strict=True):
        torch.testing.assert_close(rec.weights, expected, rtol=0, atol=1e-5)
    assert list(views.records) == [f"{layer}:{kind}" for layer in layers
                                   for kind in ("cross", "self")]
    for layer, expected in zip(layers, truth, strict=True):
        rows = expected[:, :, T - 4:].double()
        cross = rows[..., : T - 3] / rows[..., : T - 3].sum(-1, keepdim=True)
        own = rows[..., T - 4:] / rows[..., T - 4:].sum(-1, keepdim=True)
        torch.testing.assert_close(views.records[f"{layer}:cross"].weights.double(), cross,
                                   rtol=0, atol=1e-5)
        torch.testing.assert_close(views.records[f"{layer}:self"].weights.double(), own,
                                   rtol=0, atol=1e-5)
