"""Hugging Face key/value caches as plain tensors, and back (nothing here imports
transformers at module level)."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn


def cache_argument(model: nn.Module) -> str:
    """The forward's name for the key/value cache (transformers 5 renamed
    ``past_key_values`` to ``cache``)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else \
        "past_key_values"


def cache_tensors(cache: Any) -> tuple[torch.Tensor, ...]:
    """A Hugging Face DynamicCache as keys and values per layer: (k0, v0, k1, v1, ...)."""
    if hasattr(cache, "layers"):
        return tuple(t for layer in cache.layers for t in (layer.keys, layer.values))
    return tuple(t for pair in zip(cache.key_cache, cache.value_cache, strict=True)
                 for t in pair)


def cache_prefix(tensors: tuple[torch.Tensor, ...], length: int) -> Any:
    """A DynamicCache of the first ``length`` positions of ``tensors`` (as
    :func:`cache_tensors` gives them, (B, H, L, d) each); an empty cache for 0."""
    from transformers import DynamicCache

    pairs = [(k[:, :, :length], v[:, :, :length])
             for k, v in zip(tensors[::2], tensors[1::2], strict=True)]
    return DynamicCache(pairs if length else None)
