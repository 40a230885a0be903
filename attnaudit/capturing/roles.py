"""Which softmaxes are attention (the generic rules), and which columns of an attention
softmax are keys.

A softmax is attention when its output weighs values read by keys: a query's distribution
over positions. Models also normalise other things with a softmax: a mixture-of-experts
router weighs experts, a hyper-connection mixes layer outputs (residual streams), an
attention residual mixes the outputs of earlier layers or blocks (a softmax over depth), a
training loss reads router probabilities. Their weights never multiply values indexed by
positions, so they are not sites, whatever their shape (a router over as many experts as
the prompt has tokens, or a stack of as many blocks, looks like attention by shape alone;
what the weights multiply is not known when the softmax runs).

These rules are the last word on a softmax's role: the user's override
(``capture(include=..., exclude=..., roles=...)``) and the model's entry in the table of
model facts (:mod:`attnaudit.capturing.model_facts`) are asked first. Then the role is read
off the code that computes the softmax, by :data:`ROLE_RULES` in order, the first that
matches deciding (attention when none does); each rule says which code it serves and holds
an example from it that the rules after it would misread:

1. ``depth``: its module's class name ends in ``Residual(s)`` or ``AttnRes``, or its own
   name (the last part of its path) or the function calling the softmax has a
   ``_``-separated part ``res``, ``residual`` or ``attnres`` (``block_attn_res``): a
   residual connection, whose softmax weighs a stack of earlier layers' or blocks' outputs
   at each position: not attention, although such a module may call the model's own
   attention function and its class name may say attention;
2. ``attention_class``: the module's class says attention (its name contains
   ``attention`` / ``attn``, or it is ``nn.MultiheadAttention``): attention;
3. ``router_class``: its class name ends in ``Router``, ``Gate``, ``Gating``, ``MoE`` /
   ``MoeBlock`` or ``HyperConnection(s)``: not attention;
4. ``router_name``: its own name has a ``_``-separated part ``router``, ``gate``,
   ``gating``, ``moe`` or ``hc`` (``mlp.gate``, ``attn_hc``): not attention;
5. ``attention_name``: its own name contains ``attention`` / ``attn``: attention;
6. ``experts``: a module holding the experts it weighs (an ``experts`` submodule) routes;
7. ``router_function``: a function whose name contains ``rout`` or ``loss``
   (``route_tokens_to_experts``, ``load_balancing_loss_func``) calling the softmax is no
   attention.

Sink columns: learned logits concatenated to the scores before the softmax (GPT-OSS
``cat([scores, sinks], -1)``) take weight but read no value. A softmax whose caller holds a
sink (a local or module attribute named ``sinks`` / ``sink`` / ``s_aux``, or a name the
model's facts entry gives) and whose key axis is longer than the values it weighs has that
many trailing sink columns (see :func:`sink_columns`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

ATTENTION_WORDS = ("attention", "attn")
SINK_NAMES = ("sinks", "sink", "s_aux")
VALUE_NAMES = ("value_states", "value", "values", "v")


@dataclass(frozen=True)
class CallNames:
    """What the rules read of a softmax's code: its module's class name (lower case, a
    version suffix dropped), the ``_``-separated parts of the module's own name and of the
    calling function's name (digits dropped), the function's name, and the module."""

    cls: str
    leaf: frozenset[str]
    function_parts: frozenset[str]
    function: str
    module: nn.Module | None


@dataclass(frozen=True)
class RoleRule:
    """One generic rule: when ``matches``, a softmax is attention (``attention``) or not.

    serves: the code it was written for. example: ``(class name, path, calling function,
    holds experts)`` of such code, which this rule decides and the rules after it would
    decide otherwise (``tests/capturing/test_model_facts.py`` holds every rule to it)."""

    name: str
    attention: bool
    matches: Callable[[CallNames], bool]
    serves: str
    example: tuple[str, str, str, bool]


def _name_parts(name: str) -> frozenset[str]:
    """The ``_``-separated parts of a module's or function's name, digits dropped."""
    return frozenset(re.split(r"[_\d]+", name.lower()))


# Class names ending in one of these route tokens to experts or mix streams.
_ROUTER_CLASS = re.compile(r"(router|gate|gating|moe|moeblock|hyperconnections?)$")
_ROUTER_PARTS = frozenset(("router", "gate", "gating", "moe", "hc"))
_ROUTER_FUNCTIONS = ("rout", "loss")
# Class name endings and name parts of residual connections that mix layer outputs by depth.
_DEPTH_CLASS = re.compile(r"(residuals?|attnres)$")
_DEPTH_PARTS = frozenset(("res", "residual", "residuals", "attnres"))


def _says_attention(parts: frozenset[str]) -> bool:
    return any(word in part for part in parts for word in ATTENTION_WORDS)


ROLE_RULES: tuple[RoleRule, ...] = (
    RoleRule("depth", False,
             lambda n: bool(_DEPTH_CLASS.search(n.cls)
                            or _DEPTH_PARTS & (n.leaf | n.function_parts)),
             "attention residuals, softmaxes over a stack of earlier layers' or blocks' "
             "outputs: Inkling 2's Inkling2BlockAttentionResidual (run through the model's "
             "own attention function; class name says attention), `attn_res` modules, "
             "`block_attn_res` functions",
             ("Inkling2BlockAttentionResidual", "model.layers.1.attention_input",
              "eager_attention_forward", False)),
    RoleRule("attention_class", True,
             lambda n: isinstance(n.module, nn.MultiheadAttention)
             or any(w in n.cls for w in ATTENTION_WORDS),
             "attention modules that hold experts of their own (JetMoe's JetMoeAttention, a "
             "mixture of attention heads), also under a name that says nothing (a block's "
             "`mixer`, as Nemotron-H names its attention); nn.MultiheadAttention",
             ("JetMoeAttention", "model.layers.0.mixer", "forward", True)),
    RoleRule("router_class", False, lambda n: bool(_ROUTER_CLASS.search(n.cls)),
             "mixture-of-experts routers and stream mixers by class, also under a neutral "
             "name: GPT-OSS's GptOssTopKRouter, Switch's Top1Router, Mixtral's and Qwen2-MoE's "
             "SparseMoeBlock, DeepSeek-V4's DeepseekV4HyperConnection",
             ("TopKRouter", "model.layers.0.mlp.dispatch", "forward", False)),
    RoleRule("router_name", False, lambda n: bool(_ROUTER_PARTS & n.leaf),
             "routers and mixers by their own name: `mlp.gate`, `moe_gate`, DeepSeek-V4's "
             "`attn_hc` (a name that says attention whose `hc` part says hyper-connection)",
             ("Mixing", "model.layers.0.attn_hc", "forward", False)),
    RoleRule("attention_name", True, lambda n: _says_attention(n.leaf),
             "attention whose class name does not say attention but whose own name does, "
             "holding experts of its own or computed by a function named like a loss "
             "(a mixture of heads under `attn`)",
             ("MixtureOfHeads", "model.layers.0.attn", "forward", True)),
    RoleRule("experts", False,
             lambda n: isinstance(getattr(n.module, "experts", None), nn.Module),
             "feed-forward blocks that route with their own softmax and hold the experts it "
             "weighs: DBRX's DbrxFFN",
             ("DbrxFFN", "transformer.blocks.0.ffn", "forward", True)),
    RoleRule("router_function", False,
             lambda n: any(word in n.function.lower() for word in _ROUTER_FUNCTIONS),
             "router probabilities and losses computed by a function: Hugging Face's "
             "load_balancing_loss_func (Mixtral, Qwen2-MoE, OLMoE...), DBRX's "
             "route_tokens_to_experts",
             ("MixtralForCausalLM", "", "load_balancing_loss_func", False)),
)


def call_names(module: nn.Module | None, path: str, function: str) -> CallNames:
    """What the rules read of a softmax computed by ``function`` for ``module`` at ``path``."""
    cls = re.sub(r"(v?\d+)+$", "", type(module).__name__.lower()) if module is not None else ""
    return CallNames(cls=cls, leaf=_name_parts(path.rsplit(".", 1)[-1]),
                     function_parts=_name_parts(function), function=function, module=module)


def routes_or_mixes(module: nn.Module | None, path: str, function: str,
                    rules: Sequence[RoleRule] = ROLE_RULES) -> bool:
    """True when a softmax computed by ``function`` on behalf of ``module`` (at ``path``)
    weighs experts, streams or layer outputs rather than keys: the first of ``rules`` that
    matches decides; attention when none does (module docstring)."""
    names = call_names(module, path, function)
    for rule in rules:
        if rule.matches(names):
            return not rule.attention
    return False


def sink_columns(names: Mapping[str, Any], module: nn.Module | None, n_keys: int,
                 sink_names: Sequence[str] = SINK_NAMES) -> int:
    """How many trailing columns of a softmax over ``n_keys`` are sinks, not keys: the
    excess over the values' key count when the caller holds a sink; 0 otherwise.

    names: the calling frames' locals (inner first). module: the site's module.
    sink_names: the locals or module attributes that hold a sink (:data:`SINK_NAMES` and
    any the model's facts add)."""
    holds_sink = any(isinstance(names.get(n), torch.Tensor) for n in sink_names) or any(
        isinstance(getattr(module, n, None), torch.Tensor) for n in sink_names)
    if not holds_sink:
        return 0
    for name in VALUE_NAMES:
        value = names.get(name)
        if isinstance(value, torch.Tensor) and value.ndim >= 2:
            extra = n_keys - value.shape[-2]
            return extra if 0 < extra < n_keys else 0
    return 0
