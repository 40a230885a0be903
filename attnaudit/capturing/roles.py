"""Which softmaxes are attention, and which columns of an attention softmax are keys.

A softmax is attention when its output weighs values read by keys: a query's distribution
over positions. Models also normalise other things with a softmax: a mixture-of-experts
router weighs experts, a hyper-connection mixes layer outputs (residual streams), a
training loss reads router probabilities. Their weights never multiply values indexed by
positions, so they are not sites, whatever their shape (a router over as many experts as
the prompt has tokens looks like attention by shape alone). The role is read off the code
that computes the softmax:

1. the module's class says attention (its name contains ``attention`` / ``attn``, or it
   is ``nn.MultiheadAttention``): attention;
2. else its class name ends in ``Router``, ``Gate``, ``Gating``, ``MoE`` / ``MoeBlock`` or
   ``HyperConnection(s)``: not attention;
3. else its own name (the last part of its path) has a ``_``-separated part ``router``,
   ``gate``, ``gating``, ``moe`` or ``hc`` (``mlp.gate``, ``attn_hc``): not attention;
4. else its own name contains ``attention`` / ``attn``: attention;
5. else a module holding the experts it weighs (an ``experts`` submodule) routes, and a
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
SINK_NAMES = ("sinks", "sink", "s_aux")
VALUE_NAMES = ("value_states", "value", "values", "v")


def routes_or_mixes(module: nn.Module | None, path: str, function: str) -> bool:
    """True when a softmax computed by ``function`` on behalf of ``module`` (at ``path``)
    weighs experts or streams rather than keys (rules in the module docstring)."""
    cls = type(module).__name__.lower() if module is not None else ""
    if isinstance(module, nn.MultiheadAttention) or any(w in cls for w in ATTENTION_WORDS):
        return False
    if _ROLE_CLASS.search(re.sub(r"(v?\d+)+$", "", cls)):
        return True
    leaf = path.rsplit(".", 1)[-1].lower()
    if _ROLE_PARTS.intersection(re.split(r"[_\d]+", leaf)):
        return True
    if any(word in leaf for word in ATTENTION_WORDS):
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
