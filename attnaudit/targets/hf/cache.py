"""A Hugging Face model's own cache as the decoder state of one cached intervention step
(nothing here imports transformers at module level).

``decode_states`` keeps the cache object the model returned from one teacher-forced pass —
a key/value ``DynamicCache``, a hybrid cache with linear-attention, state-space or
convolution state, an ``EncoderDecoderCache`` — as a :func:`cache_state`, and ``decode_step``
takes the rows and positions it needs through that object's own API
(:func:`cache_before`: ``reorder_cache`` and ``crop`` on a copy; the copy of a cache whose
layers are all transformers' dynamic key/value layers shares their tensors, which those
calls and the step's update replace instead of writing to, so no position is copied twice).
A cache that cannot
be taken back to an earlier position (a recurrent state holds only its last position) or a
model that returns none raises :class:`~attnaudit.errors.TargetError`; the intervention
runner then re-runs the prefix instead (:mod:`attnaudit.interventions.reference_run`).
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

import torch
from torch import nn

from attnaudit.errors import TargetError


def cache_argument(model: nn.Module) -> str:
    """The forward's name for the key/value cache (transformers 5 renamed
    ``past_key_values`` to ``cache``)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else \
        "past_key_values"


def cache_state(cache: Any, batch_size: int, length: int, device: torch.device
               ) -> dict[str, Any]:
    """The decoder state of one teacher-forced pass: ``cache`` (the model's own object,
    never modified), ``rows`` (B,) long (the batch rows a selection keeps; a dict, so that
    :func:`~attnaudit.targets.contract.select_state` selects them and passes the cache
    through) and ``length``, the positions the cache holds."""
    if cache is None or not all(hasattr(cache, name) for name in ("crop", "reorder_cache")):
        raise TargetError(f"the model returned no cache it can crop and select rows of "
                          f"(got {type(cache).__name__})")
    return {"cache": cache, "rows": torch.arange(batch_size, device=device), "length": length}


def cache_before(state: dict[str, Any], length: int) -> Any:
    """A copy of the state's cache holding its selected rows and their first ``length``
    positions, taken through the cache's own API; the state's cache is left as it was.
    A TargetError when the cache cannot go back to ``length`` positions."""
    cache = _copy_for_selection(state["cache"])
    removed = state["length"] - length
    try:
        # reorder_cache (beam search's) takes any rows, repeated or not, on every layer kind
        cache.reorder_cache(state["rows"])
        if removed:
            cache.crop(-removed)
    except (RuntimeError, ValueError, NotImplementedError) as exc:
        raise TargetError(f"{type(state['cache']).__name__} cannot be taken back "
                          f"{removed} position(s): {exc}") from exc
    return cache


# layer classes whose reorder_cache, crop and update assign new key/value tensors and never
# write to the ones they hold (transformers.cache_utils)
_REPLACING_LAYERS = frozenset({"DynamicLayer", "DynamicSlidingWindowLayer"})


def _copy_for_selection(cache: Any) -> Any:
    """A deep copy of ``cache`` to select rows and positions of. When every layer of it (and
    of the self- and cross-attention caches an encoder-decoder cache holds) is one of
    ``_REPLACING_LAYERS``, the copy shares the layers' key and value tensors: the selection
    replaces them before anything could write to them. Any other cache is copied whole."""
    parts = [getattr(cache, name) for name in ("self_attention_cache", "cross_attention_cache")
             if hasattr(cache, name)] or [cache]
    layers = [layer for part in parts for layer in getattr(part, "layers", [None])]
    if not layers or any(type(layer).__name__ not in _REPLACING_LAYERS
                         or type(layer).__module__ != "transformers.cache_utils"
                         for layer in layers):
        return copy.deepcopy(cache)
    shared = {id(t): t for layer in layers for t in (layer.keys, layer.values)
              if isinstance(t, torch.Tensor)}
    return copy.deepcopy(cache, memo=shared)
