"""Bring attention tensors into the record layout ``(batch, heads, queries, keys)``."""

from __future__ import annotations

import torch

# Scores at or below this were masked by the model (-inf, finfo.min, -1e9 fills...).
MASKED_SCORE = -1e4


def as_bhqk(t: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """A view of ``t`` as ``(batch, heads, queries, keys)``.

    ``dim`` is the axis a softmax normalised. Keys are the last axis; when every axis after
    ``dim`` has size 1 (attention pooling over ``(B, n, 1)``) those axes are dropped so
    ``dim`` becomes the key axis. A softmax over another axis keeps keys last, so the
    numerics analysers can see rows that do not sum to one.
    Shapes: ``(K,)`` -> (1,1,1,K); ``(B,K)`` -> (B,1,1,K); ``(B,Q,K)`` -> (B,1,Q,K);
    ``(B,H,Q,K)`` unchanged; more axes fold into heads.
    """
    if dim is not None:
        dim = dim % t.ndim
        if dim < t.ndim - 1 and all(s == 1 for s in t.shape[dim + 1:]):
            t = t.reshape(t.shape[: dim + 1])
    if t.ndim == 4:
        return t
    if t.ndim == 1:
        return t.reshape(1, 1, 1, -1)
    if t.ndim == 2:
        return t.unsqueeze(1).unsqueeze(1)
    if t.ndim == 3:
        return t.unsqueeze(1)
    if t.ndim == 0:
        raise ValueError("attention weights must have at least one (key) axis")
    return t.reshape(t.shape[0], -1, t.shape[-2], t.shape[-1])


def eligible_from_scores(scores: torch.Tensor) -> torch.Tensor:
    """Bool mask, True where the score was not filled with a masking value.

    NaN scores count as eligible, so a NaN row shows up as non-finite weights, not as masked.
    """
    return ~(scores <= MASKED_SCORE)


def mask_like(mask: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Eligibility ``mask`` (bool, broadcastable to ``weights``) in the record layout.

    Raises ValueError when the shapes do not broadcast.
    """
    try:
        torch.broadcast_shapes(mask.shape, weights.shape)
    except RuntimeError:
        raise ValueError(
            f"key mask of shape {tuple(mask.shape)} does not broadcast to attention weights "
            f"of shape {tuple(weights.shape)}"
        ) from None
    if mask.ndim > weights.ndim:
        raise ValueError(f"key mask has {mask.ndim} axes, attention weights only {weights.ndim}")
    mask = mask.reshape((1,) * (weights.ndim - mask.ndim) + tuple(mask.shape))
    if weights.ndim > 4:
        mask = mask.expand(weights.shape)
    return as_bhqk(mask)
