"""Composing per-block contributions across layers: ALTI, ALTI+ and attention rollout.

Every block gives a row-stochastic matrix over its inputs; composing multiplies them, so the
composed row of query i says how much of layer l's output at i comes from each *input* token.

- Encoder and decoder-only stacks: R^l = C^l R^{l-1}, R^0 = I.
- Encoder-decoder (ALTI+, Ferrando et al. 2022b): a decoder layer's output at step i is over
  the n source tokens and the T prefix inputs (the start token, then ``emitted[:, :-1]``).
  R^0 = [0 | I]; the self-attention block C_self (T, T) composes the previous layer, and the
  cross-attention block splits the rest between its residual (weight c_res, the decoder
  stream) and the encoder outputs (C_src, (T, n)), each of which is itself the composed
  encoder R_enc (n, n): R^l = c_res · (C_self R^{l-1}) + C_src [R_enc | 0].
- Rollout (Abnar & Zuidema 2020) is the same composition of the head-mean weights Ā with the
  residual as an equal partner: self blocks ½(Ā + I), cross blocks [½ Ā_src | ½], each row
  renormalised to sum to 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

TINY = 1e-30


def normalised(rows: torch.Tensor) -> torch.Tensor:
    """Rows scaled to sum to 1 (a zero row stays zero)."""
    return rows / rows.sum(-1, keepdim=True).clamp_min(TINY)


def rollout_self(weights: torch.Tensor) -> torch.Tensor:
    """(B, Q, Q): ½(Ā + I) row-normalised, Ā the head mean of weights (B, H, Q, Q)."""
    mean = weights.float().mean(1)
    eye = torch.eye(mean.shape[-1], device=mean.device)
    return normalised(0.5 * (mean + eye))


def rollout_cross(weights: torch.Tensor) -> torch.Tensor:
    """(B, T, n + 1): [½ Ā | ½] row-normalised, the last column the decoder's residual."""
    mean = weights.float().mean(1)
    return normalised(torch.cat([0.5 * mean, torch.full_like(mean[..., :1], 0.5)], dim=-1))


def compose(blocks: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """R^l = C^l R^{l-1} for square blocks (B, N, N), R^0 = I; one per layer."""
    composed: list[torch.Tensor] = []
    current: torch.Tensor | None = None
    for block in blocks:
        current = block if current is None else torch.matmul(block, current)
        composed.append(current)
    return composed


def compose_decoder(self_blocks: Sequence[torch.Tensor], cross_blocks: Sequence[torch.Tensor],
                    encoder: torch.Tensor) -> list[torch.Tensor]:
    """ALTI+ composition (module docstring); one (B, T, n + T) per decoder layer.

    self_blocks: per layer (B, T, T). cross_blocks: per layer (B, T, n + 1), the last column
    the residual. encoder: the composed encoder, (B, n, n)."""
    batch, steps = self_blocks[0].shape[:2]
    n = encoder.shape[-1]
    source = torch.cat([encoder, encoder.new_zeros(batch, n, steps)], dim=-1)  # (B, n, n+T)
    current = torch.cat([encoder.new_zeros(batch, steps, n),
                         torch.eye(steps, device=encoder.device).expand(batch, -1, -1)], -1)
    composed = []
    for self_block, cross_block in zip(self_blocks, cross_blocks, strict=True):
        mixed = torch.matmul(self_block, current)
        current = (cross_block[..., -1:] * mixed
                   + torch.matmul(cross_block[..., :-1], source))
        current = normalised(current)
        composed.append(current)
    return composed
