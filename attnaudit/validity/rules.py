"""Declared key rules: which keys each attention site may attend, and which rows count.

Which keys may be attended is *declared* from the target, not read off the model, so a
mask applied after the softmax or masked scores filled with 0 show up as masked mass:

=============  =======================  ==========================  ======================
role           recognised by            eligible keys               rows counted
=============  =======================  ==========================  ======================
cross          (Q, K) = (T, n)          real source tokens          steps up to first EOS
encoder_self   (Q, K) = (n, n)          real source tokens          real source tokens
decoder_self   (Q, K) = (T, T)          causal (key <= query)       steps up to first EOS
captured       any other shape          the key mask capture saw    every row
=============  =======================  ==========================  ======================

n source positions, T emitted steps; the roles are :class:`~attnaudit.record.Role`'s. When
n == T, a square site is cross-attention only if its kind says so, and encoder or decoder
self-attention by its module path (a decoder-only model's prefix view, whose record carries
the role :attr:`~attnaudit.record.Role.CONTINUATION` from capture, is decoder
self-attention); a site neither decides stays "captured". The declared rule is combined
(AND) with the key mask capture saw, so keys a model masks on purpose (local windows...)
stay out of the distribution metrics; weight on them still counts as masked mass.

Rows after the first end-of-sequence step (``target.step_mask``) are padding and are not
counted anywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch

from attnaudit.analysis import AttentionRows
from attnaudit.record import AttentionRecord, Role, Site
from attnaudit.targets.contract import Batch

# The sites table's ``eligibility`` entry per role; any other role gets CAPTURED_RULE.
DECLARED_RULES: dict[str, str] = {  # by role (a Role is its string)
    Role.CROSS: "declared: real source tokens",
    Role.ENCODER_SELF: "declared: real source tokens",
    Role.DECODER_SELF: "declared: causal",
}
CAPTURED_RULE = "captured key mask"


def site_role(site: Site, queries: int, keys: int, n_source: int, n_target: int) -> Role:
    """cross, encoder_self, decoder_self or captured (no declared rule fits) for ``site``
    with ``queries`` x ``keys`` stacked weights; see the module docstring. A decoder-only
    model's prefix view (``site.role`` :attr:`~attnaudit.record.Role.CONTINUATION`,
    :mod:`attnaudit.capturing.views`) has steps for queries."""
    kind = site.kind
    if (queries, keys) == (n_target, n_source) and (kind == "cross" or n_target != n_source):
        return Role.CROSS
    if kind == "cross":
        return Role.CAPTURED
    encoder = (queries, keys) == (n_source, n_source)
    decoder = (queries, keys) == (n_target, n_target)
    if encoder and decoder and site.role == Role.CONTINUATION:
        return Role.DECODER_SELF
    if encoder and decoder:
        module = site.name.split(":", 1)[0].lower()
        encoder, decoder = "encoder" in module, "decoder" in module
        if encoder == decoder:
            return Role.CAPTURED
    if encoder:
        return Role.ENCODER_SELF
    if decoder:
        return Role.DECODER_SELF
    return Role.CAPTURED


def site_roles(records: Mapping[str, AttentionRecord], n_source: int, n_target: int
               ) -> dict[str, Role]:
    """Each record's role (:func:`site_role`) for one batch of ``n_source`` source positions
    and ``n_target`` emitted steps."""
    return roles_of_shapes({name: (r.site, *r.weights.shape[2:]) for name, r in records.items()},
                           n_source, n_target)


def roles_of_shapes(shapes: Mapping[str, tuple[Site, int, int]], n_source: int,
                    n_target: int) -> dict[str, Role]:
    """:func:`site_roles` from each site and its (stacked queries, keys)."""
    return {name: site_role(site, queries, keys, n_source, n_target)
            for name, (site, queries, keys) in shapes.items()}


def rows_of(declared: torch.Tensor | None, rows: torch.Tensor | None, role: str, start: int,
            stop: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """:func:`declared_rule`'s (eligible keys, rows that count) cut to a site's query rows
    ``start:stop`` (one call of it, when calls are analysed as they arrive)."""
    if declared is not None and role == Role.DECODER_SELF:
        declared = declared[:, :, start:stop]
    return declared, None if rows is None else rows[:, start:stop]


def declared_rule(role: str, batch: Batch, step_mask: torch.Tensor
                  ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(eligible keys, bool (B, 1, Q or 1, K) or None; rows that count, bool (B, Q) or None)."""
    source = batch.source_mask.bool()
    if role == Role.CROSS:
        return source[:, None, None, :], step_mask
    if role == Role.ENCODER_SELF:
        return source[:, None, None, :], source
    if role == Role.DECODER_SELF:
        steps = step_mask.shape[1]
        causal = torch.ones(steps, steps, dtype=torch.bool, device=step_mask.device).tril()
        return causal[None, None], step_mask
    return None, None


def declared_rows(record: AttentionRecord, declared: torch.Tensor | None) -> AttentionRows:
    """The record's rows under the declared key rule AND the key mask capture saw.

    ``declared``: bool, read by rank ((K,), (B, K), (B, Q, K), (B, H, Q, K)); None keeps
    the captured mask alone (all keys when capture has none either).
    """
    data = AttentionRows.of(record, declared)
    captured = record.key_mask
    if declared is None or captured is None:
        return data
    return replace(data, eligible=data.eligible & captured.to(data.eligible.device))
