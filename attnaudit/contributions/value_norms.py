"""Norm-based contributions (Kobayashi et al. 2020, "Attention is Not Only a Weight").

Head h's contribution of key j to query i is the vector a^h_ij f_h(x_j) with
f_h(x) = (x W_V^h + b_V^h) W_O^h; its norm ``per_head`` is a^h_ij ‖f_h(x_j)‖ (a >= 0), and
the heads together contribute ‖Σ_h a^h_ij f_h(x_j)‖ (``summed``), the output-projection bias
being no key's. Units: the model's hidden-state norm.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnaudit.contributions.trace import SiteTrace


@dataclass
class ValueNorms:
    """One site's norm-based contributions.

    per_head: (B, H, Q, K) float32, ‖a^h_ij f_h(x_j)‖. summed: (B, Q, K) float32,
    ‖Σ_h a^h_ij f_h(x_j)‖. key_norms: (B, H, K) float32, ‖f_h(x_j)‖.
    """

    site: str
    per_head: torch.Tensor
    summed: torch.Tensor
    key_norms: torch.Tensor


def value_norms(site: SiteTrace, vectors: torch.Tensor) -> ValueNorms:
    """The site's norm-based contributions (module docstring), from its head vectors
    f_h(x_j) (B, H, K, d) (:func:`~attnaudit.contributions.projection.head_vectors`)."""
    key_norms = vectors.norm(dim=-1)
    per_head = site.weights * key_norms[:, :, None, :]
    # ‖Σ_h a_h f_h‖² = Σ_h Σ_g a_h a_g <f_h, f_g>: the heads' Gram matrix per key (B, K, H, H)
    # costs H² per (query, key) instead of the H * d of the summed vectors
    by_key = vectors.transpose(1, 2)  # (B, K, H, d)
    gram = torch.matmul(by_key, by_key.transpose(-1, -2))  # (B, K, H, H)
    weights = site.weights.permute(0, 3, 2, 1)  # (B, K, Q, H)
    squared = (torch.matmul(weights, gram) * weights).sum(-1)  # (B, K, Q)
    summed = squared.clamp_min(0).sqrt().transpose(1, 2)
    return ValueNorms(site.name, per_head, summed, key_norms)
