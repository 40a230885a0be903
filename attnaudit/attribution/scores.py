"""Token scores: gradients and attribution vectors reduced over the embedding dimension, and
their normalisation into the importance that agreement ranks."""

from __future__ import annotations

import torch

SCORE_REDUCTIONS = ("sum", "norm")  # over the embedding dimension: signed sum or L2 norm


def reduced(vectors: torch.Tensor, reduction: str) -> torch.Tensor:
    """Attribution vectors (..., d) -> token scores (...): signed ``sum`` or L2 ``norm``."""
    return vectors.sum(-1) if reduction == "sum" else vectors.norm(dim=-1)


def token_score(grads: torch.Tensor, at: torch.Tensor | None, reduction: str) -> torch.Tensor:
    """(R, c, k, d) gradients -> (R, c, k) scores: ``||g||`` (``at`` None, saliency), else
    ``g * at`` reduced over d by ``reduction``; ``at`` (R, k, d) or (R, c, k, d)."""
    if at is None:
        return grads.float().norm(dim=-1)
    return reduced((grads * (at[:, None] if at.ndim == grads.ndim - 1 else at)).float(),
                   reduction)


def normalised_importance(scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``|scores|`` (B, T, n) restricted to ``valid`` (B, T, n) bool (eligible keys at valid
    steps), normalised to sum 1 per (example, step); an all-zero row stays zero."""
    mass = scores.abs() * valid.to(scores.dtype)
    total = mass.sum(-1, keepdim=True)
    return torch.where(total > 0, mass / total.clamp_min(torch.finfo(mass.dtype).tiny), mass)
