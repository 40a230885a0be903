"""Prompt views: a decoder-only model's self-attention seen as cross- and self-attention.

A causal language model continuing a prompt has one attention per layer, over every earlier
position. While :func:`prompt_views` is active (a decoder-only target's callables run the
model inside it), capture presents each of those calls as two views instead of the raw
weights, each record carrying its role (:class:`~attnaudit.record.Role`):

- ``<site>:cross``, role :attr:`~attnaudit.record.Role.PROMPT` (the string ``cross``): the
  continuation's query rows over the prompt keys ``0..P-1``;
- ``<site>:self``, role :attr:`~attnaudit.record.Role.CONTINUATION` (``decoder_self``): the
  same rows over the keys ``P-1..``: the prompt's last token (the input of continuation
  step 0, as a seq2seq decoder's start token) and the generated prefix.

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
and the self view is cut from the result. Where the adapter holds the call's values, a
value edit (``capture(value_edit=)``) sees each view's weights and values (:meth:`View.values`)
and what it changes in a view's read reaches the call's rows scaled by the view's share
(:meth:`attnaudit.capturing.recorder.Capture.value_read`; key ``P-1``'s value edited in
both views changes the call's read twice, once per view). At a cached step the call's
values include the cache's, so an edit of a prompt key's value changes what the step's
rows read from the cache; the cache itself is left as it is.

Views are in absolute positions: a call that sees only the last K positions (a
sliding-window cache; ``prompt_views(..., positions=)`` says how many the pass has seen)
gets zero-weight, ineligible keys for the ones it does not see, so its rows line up with a
full pass's. A view is renormalised by its own mass, without a floor, however small; each
view record keeps the share of the raw row it held (``share``). Sink columns
(:mod:`attnaudit.capturing.roles`) are no keys: a view row plus its sink weight sums to
what the raw row does. Only calls whose queries are one stream of
positions are cut (:func:`position_stream`); a layer run twice over the same positions in
one pass gives a second set of views, ``<site>#2:cross`` / ``#2:self``
(:func:`run_name`), rather than twice the rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from attnaudit.capturing.layout import Layout
from attnaudit.capturing.state import ACTIVE
from attnaudit.record import Role

VIEW_KINDS = ("cross", "self")
VIEW_ROLES = {"cross": Role.PROMPT, "self": Role.CONTINUATION}  # each view's record role


@dataclass
class PromptViews:
    """What a block of :func:`prompt_views` tells capture about its pass: ``prompt_length``
    P, ``positions`` the pass has seen (None: every call sees every position), ``lead`` E
    (keys of the model's own before the sequence's), and ``runs``: per site, where each of
    its runs in the block ended (:func:`run_name`)."""

    prompt_length: int
    positions: int | None = None
    lead: int = 0
    runs: dict[str, list[int]] = field(default_factory=dict)


@contextmanager
def prompt_views(prompt_length: int, positions: int | None = None,
                 lead: int = 0) -> Iterator[PromptViews]:
    """Within the block, capture shows self-attention as prompt views (module docstring);
    ``prompt_length``: P, the (left-padded) prompt positions of the running batch;
    ``positions``: how many positions the block's pass has seen, its own included (P + t
    for cached step t), which places a call that sees fewer keys (a sliding-window cache
    keeps the last ones); None: every call sees every position. ``lead``: E, the keys of
    the model's own before the sequence's in every call (module docstring), not counted in
    ``positions``. One model pass per block. The block's :class:`PromptViews` is held
    beside the active capture (:data:`attnaudit.capturing.state.ACTIVE`), where the
    recorder reads it and hands it to :func:`active_views` and :func:`run_name`, whether
    the capture is entered inside the block or around it."""
    before = ACTIVE.views
    ACTIVE.views = PromptViews(prompt_length, positions, lead)
    try:
        yield ACTIVE.views
    finally:
        ACTIVE.views = before


def _ratio(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    """numerator / denominator, 0 where the denominator is 0 (NaN stays NaN)."""
    return torch.where(denominator == 0, 0.0, numerator / denominator)


def _widened(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32, or wider when it already is (half precision sums badly)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


@dataclass(frozen=True)
class View:
    """One block of a call's weights (B, H, Q, K): query rows ``rows:``, keys ``keys``,
    after ``pad`` view keys the call does not see (evicted from a sliding-window cache:
    zero weight, ineligible); the call's first ``lead`` keys are the model's own, no
    positions of the sequence (counted as a sink's). ``kind`` names the view's site
    (``<site>:cross`` / ``:self``); :attr:`role` is the role its record carries."""

    kind: str
    rows: int
    keys: slice
    pad: int = 0
    lead: int = 0

    @property
    def role(self) -> Role:
        return VIEW_ROLES[self.kind]

    def _block(self, weights: torch.Tensor) -> torch.Tensor:
        """(B, H, Q_view, K_view) in float32 or wider, the ``pad`` unseen keys first."""
        block = _widened(weights[:, :, self.rows:, self.keys])
        return F.pad(block, (self.pad, 0)) if self.pad else block

    def mass(self, weights: torch.Tensor) -> torch.Tensor:
        """(B, H, Q_view, 1) float32 or wider: the raw weight the block holds per row."""
        return self._block(weights).sum(-1, keepdim=True)

    def total(self, weights: torch.Tensor) -> torch.Tensor:
        """(B, H, Q_view, 1) float32 or wider: what the view's raw rows sum to over all keys
        (sink columns and leading keys are none: they are counted by the record's
        ``sink``)."""
        return _widened(weights[:, :, self.rows:, self.lead:]).sum(-1, keepdim=True)

    def of(self, weights: torch.Tensor) -> torch.Tensor:
        """(B, H, Q_view, K_view): the block renormalised per row and scaled by the raw row's
        total, in the weights' dtype. No floor under the block's mass: a row whose mass is
        below float32's normal range (~1e-39, subnormal) is divided by that mass itself,
        which keeps the ratios (block / mass never exceeds 1, so nothing overflows); a row
        of zero mass stays zero."""
        block = self._block(weights)
        normalised = _ratio(block, block.sum(-1, keepdim=True))
        return (normalised * self.total(weights)).to(weights.dtype)

    def share(self, weights: torch.Tensor) -> torch.Tensor:
        """(B, H, Q_view, 1) float64: the share of each raw row's total the block holds."""
        return _ratio(self.mass(weights).double(), self.total(weights).double())

    def sink(self, sink: torch.Tensor | None, weights: torch.Tensor) -> torch.Tensor | None:
        """The sink weight (B, H, Q_view, 1) of the view's rows: the call's ``sink``
        (B, H, Q, 1) plus, when the call has leading keys, their weight in ``weights``
        (B, H, Q, K) (float32 or wider then); None when there is neither."""
        own = None if sink is None else sink[:, :, self.rows:]
        if not self.lead:
            return own
        held = _widened(weights[:, :, self.rows:, : self.lead]).sum(-1, keepdim=True)
        return held if own is None else held + own

    def values(self, values: torch.Tensor) -> torch.Tensor:
        """The view's keys' values (B, H, K_view, d_v) of the call's ``values``
        (B, H, K, d_v), zero for the ``pad`` unseen keys (which have zero weight)."""
        block = values[:, :, self.keys]
        return F.pad(block, (0, 0, self.pad, 0)) if self.pad else block

    def mask(self, key_mask: torch.Tensor | None) -> torch.Tensor | None:
        """A key mask broadcastable to the call's weights cut to the block's."""
        if key_mask is None:
            return None
        rows = slice(self.rows, None) if key_mask.shape[2] > 1 else slice(None)
        block = key_mask[:, :, rows, self.keys]
        return F.pad(block, (self.pad, 0), value=False) if self.pad else block

    def write(self, weights: torch.Tensor, edited: torch.Tensor) -> torch.Tensor:
        """``weights`` with the block replaced by ``edited`` (a view) times the block's mass
        over the row's total; weight an edit puts on unseen keys is dropped."""
        new = weights.clone()
        edited = _widened(edited)
        scaled = edited * self.share(weights).detach().to(edited.dtype)
        new[:, :, self.rows:, self.keys] = scaled[..., self.pad:].to(weights.dtype)
        return new


def position_stream(layout: Layout) -> bool:
    """True when a call's queries lie on one axis (one stream of positions) and can be cut
    into views; a call with queries on two axes (ProphetNet's n-gram predict streams
    ``(B, ngram, H, T, 2T)``, query blocks) is recorded as it is."""
    return sum(any(x == "q" for x, _ in group) for group in layout.groups) <= 1


def active_views(block: PromptViews | None, shape: tuple[int, ...],
                 trailing: int = 0) -> list[View] | None:
    """The views of a call with weights of ``shape`` (B, H, Q, K) in a ``block`` of prompt
    views (empty when the call has no continuation row); None outside one (``block``
    None). The call's queries end ``trailing`` rows before the pass's last position
    (``trailing`` > 0: a block of a call computed in query blocks) and its keys are the
    last K."""
    if block is None:
        return None
    prompt, lead = block.prompt_length, block.lead
    queries, keys = shape[2], shape[3] - lead  # the sequence's keys
    positions = block.positions or keys
    offset = positions - keys  # absolute position of the call's first sequence key
    # a pass that computes the leading positions has their rows first: never view rows
    first = max(prompt - 1 - (positions - trailing - queries), 0)
    if first >= queries or positions < prompt or offset < 0 or keys < 1:
        return []
    cross = slice(lead, lead + max(prompt - offset, 0))
    own = slice(lead + max(prompt - 1 - offset, 0), lead + keys)
    return [View("cross", first, cross, min(offset, prompt), lead),
            View("self", first, own, max(offset - (prompt - 1), 0), lead)]


def run_name(block: PromptViews, base: str, shape: tuple[int, ...], trailing: int = 0) -> str:
    """``base``, or ``base#n`` for a call that runs a site again over positions the
    ``block`` already saw it run over (a layer run twice per pass): its n-th run, a site of
    its own. ``trailing`` as in :func:`active_views`: a later query block of one call
    continues its run."""
    queries, keys = shape[2], shape[3] - block.lead
    stop = (block.positions or keys) - trailing
    start = stop - queries
    runs = block.runs.setdefault(base, [])
    at = next((i for i, end in enumerate(runs) if end <= start), len(runs))
    if at == len(runs):
        runs.append(stop)
    else:
        runs[at] = stop
    return base if at == 0 else f"{base}#{at + 1}"


def view_mask_source(view: View, source: Callable[[], torch.Tensor | None] | None
                     ) -> Callable[[], torch.Tensor | None] | None:
    """A lazy key-mask source for ``view`` from the call's own."""
    if source is None:
        return None
    return lambda: view.mask(source())
