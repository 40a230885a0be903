"""Norm-based contributions (Kobayashi et al. 2020, "Attention is Not Only a Weight").

Head h's contribution of key j to query i is the vector a^h_ij f_h(x_j) with
f_h(x) = (x W_V^h + b_V^h) W_O^h; its norm ``per_head`` is a^h_ij ‖f_h(x_j)‖ (a >= 0), and
the heads together contribute ‖Σ_h a^h_ij f_h(x_j)‖ (``summed``), the output-projection bias
being no key's. Units: the model's hidden-state norm.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from attnaudit.contributions.projection import Projection, head_vectors
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


def attention_terms(weights: torch.Tensor, vectors: torch.Tensor) -> Iterator[torch.Tensor]:
    """Per example, (Q, K, d) float32: Σ_h a^h_qk f_h(x_k), from weights (B, H, Q, K) and
    head vectors (B, H, K, d); one example at a time, so memory is Q * K * d."""
    for b in range(weights.shape[0]):
        yield torch.einsum("hqk,hkd->qkd", weights[b], vectors[b])


def value_norms(site: SiteTrace, projection: Projection) -> ValueNorms:
    """The site's norm-based contributions (module docstring)."""
    vectors = head_vectors(site, projection)
    key_norms = vectors.norm(dim=-1)
    per_head = site.weights * key_norms[:, :, None, :]
    summed = torch.stack([terms.norm(dim=-1)
                          for terms in attention_terms(site.weights, vectors)])
    return ValueNorms(site.name, per_head, summed, key_norms)
