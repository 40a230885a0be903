"""What an adapter needs from the active capture: a :class:`typing.Protocol` the recorder's
``Capture`` satisfies, so that adapters type against it and never import the recorder."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from attnaudit.capturing.layout import Layout
from attnaudit.capturing.sites import SiteRegistry
from attnaudit.record import Kind, Site

# (site, weights (B, H, Q, K) as the model uses them, values (B, H, K, d_v)) -> the call's
# read (B, H, Q, d_v) with the edit's own values (e.g. weights @ new_values, or some query
# rows only), or None for the model's own weights @ values.
ValueEdit = Callable[[Site, torch.Tensor, torch.Tensor], torch.Tensor | None]


@dataclass
class MhaCall:
    """An ``nn.MultiheadAttention`` call in progress, for the softmax it will make.

    read: set by the softmax adapter when a value edit applies to the call: its layout and
    its values ``v`` (batch * heads, keys, d_v), for the weights-times-values product that
    follows (:mod:`attnaudit.capturing.mha`); None once that read is made."""

    module: nn.Module
    site: Site
    asked: bool  # did the caller ask for weights itself?
    read: tuple[Layout, torch.Tensor] | None = None


class ActiveCapture(Protocol):
    """The capture an adapter reports to.

    busy: True while the capture's own code (an edit) runs, so its softmaxes are not
    recorded. keep_values: record each call's values too. value_edit: the user's value
    edit, or None (an adapter that holds a call's values hands them to :meth:`value_read`
    only when there is one). max_memory: bytes a block of explicit attention may use.
    mha_stack: the
    ``nn.MultiheadAttention`` calls in progress, innermost last. sites_registry: site
    naming and selection for the model.
    """

    busy: bool
    keep_values: bool
    value_edit: ValueEdit | None
    max_memory: int
    mha_stack: list[MhaCall]
    sites_registry: SiteRegistry

    def layout(self, site: Site, shape: tuple[int, ...], key_dim: int,
               names: Callable[[], Mapping[str, Any]] | None, *, from_call: bool = False,
               query_last: bool = False) -> Layout:
        """How a call of ``shape`` (keys on ``key_dim``) maps onto (B, H, Q, K)."""
        ...

    def record(self, site: Site, layout: Layout, weights: torch.Tensor,
               mask_source: Callable[[], torch.Tensor | None] | None,
               scores: torch.Tensor | None, values: Callable[[], torch.Tensor] | None,
               sink: torch.Tensor | None = None, trailing: int = 0) -> torch.Tensor | None:
        """Store one call's weights (B, H, Q, K) and sink weight (B, H, Q, 1); the edit's
        replacement, or None. ``values``: where the adapter holds the call's values, a
        function giving them as (B, H, K, d_v), called only when they are kept or edited.
        ``trailing``: the call's query rows after these (a query block)."""
        ...

    def value_read(self, weights: torch.Tensor, values: torch.Tensor) -> torch.Tensor | None:
        """The value edit's read ``(B, H, Q, d_v)`` of the call :meth:`record` just stored,
        from its weights ``(B, H, Q, K)`` as the model uses them and its values
        ``(B, H, K, d_v)``; None: the model's own ``weights @ values``."""
        ...

    def first_needed_row(self, site: Site, queries: int, keys: int) -> int:
        """The first query row of a call whose weights are recorded."""
        ...

    def on_tap(self, name: str, weights: torch.Tensor, key_mask: torch.Tensor | None,
               kind: Kind | None, names: Callable[[], Mapping[str, Any]]) -> torch.Tensor:
        """Record an explicitly tapped call; the weights the model should use."""
        ...
