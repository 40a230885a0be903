"""Prompt views: a decoder-only model's self-attention seen as cross- and self-attention.

A causal language model continuing a prompt has one attention per layer, over every earlier
position. While :func:`prompt_views` is active (a causal target's callables run the model
inside it), capture presents each of those calls as two views instead of the raw weights:

- ``<site>:cross``: the continuation's query rows over the prompt keys ``0..P-1``;
- ``<site>:self``: the same rows over the keys ``P-1..``: the prompt's last token (the
  input of continuation step 0, as a seq2seq decoder's start token) and the generated prefix.

Query rows are the positions ``>= P-1`` (the row at ``P-1 + t`` predicts continuation token
``t``); a call's queries are its last ``Q`` of ``K`` positions, so a full teacher-forced pass
and a cached one-token step map alike. Each view is renormalised over its own keys and
scaled by its raw row's total, so that a view row sums to what the raw row sums to: 1 for a
valid attention (a distribution, as the analysers and interventions expect), and a raw row
that is off (does not sum to 1, or is not finite) is off in both views, where the row-sum
and finiteness checks see it. The share of the raw row a view holds is left out. An edit of
a view is written back scaled by the view's original mass over the row's total (held
constant: no gradient flows through it), and the rest of the row is left as it was. Key
``P-1`` is in both views; when both are edited in one call the cross view is written first
and the self view is cut from the result.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

VIEW_KINDS = ("cross", "self")


class _Active:
    prompt_length: int | None = None


ACTIVE_VIEWS = _Active()


@contextmanager
def prompt_views(prompt_length: int) -> Iterator[None]:
    """Within the block, capture shows self-attention as prompt views (module docstring);
    ``prompt_length``: P, the (left-padded) prompt positions of the running batch."""
    before, ACTIVE_VIEWS.prompt_length = ACTIVE_VIEWS.prompt_length, prompt_length
    try:
        yield
    finally:
        ACTIVE_VIEWS.prompt_length = before


@dataclass(frozen=True)
class View:
    """One block of a call's weights (B, H, Q, K): query rows ``rows:``, keys ``keys``."""

    kind: str
    rows: int
    keys: slice

    def mass(self, weights: torch.Tensor) -> torch.Tensor:
        """(B, H, Q_view, 1) float32: the raw weight the block holds per row."""
        block = weights[:, :, self.rows:, self.keys].float()
        return block.sum(-1, keepdim=True)

    def total(self, weights: torch.Tensor) -> torch.Tensor:
        """(B, H, Q_view, 1) float32: what the view's raw rows sum to over all keys."""
        return weights[:, :, self.rows:].float().sum(-1, keepdim=True)

    def of(self, weights: torch.Tensor) -> torch.Tensor:
        """(B, H, Q_view, K_view): the block renormalised per row and scaled by the raw row's
        total, in the weights' dtype."""
        block = weights[:, :, self.rows:, self.keys].float()
        mass = self.mass(weights).clamp_min(torch.finfo(torch.float32).tiny)
        return (block / mass * self.total(weights)).to(weights.dtype)

    def mask(self, key_mask: torch.Tensor | None) -> torch.Tensor | None:
        """A key mask broadcastable to the call's weights cut to the block's."""
        if key_mask is None:
            return None
        rows = slice(self.rows, None) if key_mask.shape[2] > 1 else slice(None)
        return key_mask[:, :, rows, self.keys]

    def write(self, weights: torch.Tensor, edited: torch.Tensor) -> torch.Tensor:
        """``weights`` with the block replaced by ``edited`` (a view) times the block's mass
        over the row's total."""
        new = weights.clone()
        total = self.total(weights).clamp_min(torch.finfo(torch.float32).tiny)
        scaled = edited.float() * (self.mass(weights) / total).detach()
        new[:, :, self.rows:, self.keys] = scaled.to(weights.dtype)
        return new


def active_views(shape: tuple[int, ...], trailing: int = 0) -> list[View] | None:
    """The views of a call with weights of ``shape`` (B, H, Q, K) while prompt views are
    active (empty when the call has no continuation row), else None. ``trailing``: query
    rows of the call after these (a block of a call computed in query blocks)."""
    prompt = ACTIVE_VIEWS.prompt_length
    if prompt is None:
        return None
    queries, keys = shape[2], shape[3]
    first = max(prompt - 1 - (keys - queries - trailing), 0)
    if first >= queries or keys < prompt:
        return []
    return [View("cross", first, slice(0, prompt)), View("self", first, slice(prompt - 1, keys))]


def view_mask_source(view: View, source: Callable[[], torch.Tensor | None] | None
                     ) -> Callable[[], torch.Tensor | None] | None:
    """A lazy key-mask source for ``view`` from the call's own."""
    if source is None:
        return None
    return lambda: view.mask(source())
