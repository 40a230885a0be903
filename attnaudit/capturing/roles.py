"""Which softmaxes are attention, and which columns of an attention softmax are keys.

A softmax is attention when its output weighs values read by keys: a query's distribution
over positions. Models also normalise other things with a softmax: a mixture-of-experts
router weighs experts, a hyper-connection mixes layer outputs (residual streams), an
attention residual mixes the outputs of earlier layers or blocks (a softmax over depth), a
training loss reads router probabilities. Their weights never multiply values indexed by
positions, so they are not sites, whatever their shape (a router over as many experts as
the prompt has tokens, or a stack of as many blocks, looks like attention by shape alone;
what the weights multiply is not known when the softmax runs). The role is read off the
code that computes the softmax:

1. its module's class name ends in ``Residual(s)`` or ``AttnRes``, or its own name (the
   last part of its path) or the function calling the softmax has a ``_``-separated part
   ``res``, ``residual`` or ``attnres`` (``block_attn_res``): a residual connection, whose
   softmax weighs a stack of earlier layers' or blocks' outputs at each position (attention
   residuals, Inkling 2's ``BlockAttentionResidual``): not attention, although such a
   module may call the model's own attention function and its class name may say attention;
2. else the module's class says attention (its name contains ``attention`` / ``attn``, or
   it is ``nn.MultiheadAttention``): attention;
3. else its class name ends in ``Router``, ``Gate``, ``Gating``, ``MoE`` / ``MoeBlock`` or
   ``HyperConnection(s)``: not attention;
4. else its own name has a ``_``-separated part ``router``, ``gate``, ``gating``, ``moe`` or
   ``hc`` (``mlp.gate``, ``attn_hc``): not attention;
5. else its own name contains ``attention`` / ``attn``: attention;
6. else a module holding the experts it weighs (an ``experts`` submodule) routes, and a
   function whose name contains ``rout`` or ``loss`` (``route_tokens_to_experts``,
   ``load_balancing_loss_func``) calling the softmax is no attention.

Sink columns: learned logits concatenated to the scores before the softmax (GPT-OSS
``cat([scores, sinks], -1)``) take weight but read no value. A softmax whose caller holds a
sink (a local or module attribute named ``sinks`` / ``sink`` / ``s_aux``) and whose key axis
is longer than the values it weighs has that many trailing sink columns (see
:func:`sink_columns`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

ATTENTION_WORDS = ("attention", "attn")
# Class names ending in one of these route tokens to experts or mix streams.
_ROLE_CLASS = re.compile(r"(router|gate|gating|moe|moeblock|hyperconnections?)$")
_ROLE_PARTS = frozenset(("router", "gate", "gating", "moe", "hc"))
_ROLE_FUNCTIONS = ("rout", "loss")
# Class name endings and name parts of residual connections that mix layer outputs by depth.
_DEPTH_CLASS = re.compile(r"(residuals?|attnres)$")
_DEPTH_PARTS = frozenset(("res", "residual", "residuals", "attnres"))
SINK_NAMES = ("sinks", "sink", "s_aux")
VALUE_NAMES = ("value_states", "value", "values", "v")


def _name_parts(name: str) -> set[str]:
    """The ``_``-separated parts of a module's or function's name, digits dropped."""
    return set(re.split(r"[_\d]+", name.lower()))


def routes_or_mixes(module: nn.Module | None, path: str, function: str) -> bool:
    """True when a softmax computed by ``function`` on behalf of ``module`` (at ``path``)
    weighs experts, streams or layer outputs rather than keys (rules in the module
    docstring)."""
    cls = re.sub(r"(v?\d+)+$", "", type(module).__name__.lower()) if module is not None else ""
    leaf = _name_parts(path.rsplit(".", 1)[-1])
    if _DEPTH_CLASS.search(cls) or _DEPTH_PARTS.intersection(leaf | _name_parts(function)):
        return True
    if isinstance(module, nn.MultiheadAttention) or any(w in cls for w in ATTENTION_WORDS):
        return False
    if _ROLE_CLASS.search(cls) or _ROLE_PARTS.intersection(leaf):
        return True
    if any(word in part for part in leaf for word in ATTENTION_WORDS):
        return False
    if isinstance(getattr(module, "experts", None), nn.Module):
        return True
    return any(word in function.lower() for word in _ROLE_FUNCTIONS)


def sink_columns(names: Mapping[str, Any], module: nn.Module | None, n_keys: int) -> int:
    """How many trailing columns of a softmax over ``n_keys`` are sinks, not keys: the
    excess over the values' key count when the caller holds a sink; 0 otherwise.

    names: the calling frames' locals (inner first). module: the site's module."""
    holds_sink = any(isinstance(names.get(n), torch.Tensor) for n in SINK_NAMES) or any(
        isinstance(getattr(module, n, None), torch.Tensor) for n in SINK_NAMES)
    if not holds_sink:
        return 0
    for name in VALUE_NAMES:
        value = names.get(name)
        if isinstance(value, torch.Tensor) and value.ndim >= 2:
            extra = n_keys - value.shape[-2]
            return extra if 0 < extra < n_keys else 0
    return 0
