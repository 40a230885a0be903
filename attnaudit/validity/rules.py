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

n source positions, T emitted steps. When n == T, a square site is cross-attention only
if its kind says so, and encoder or decoder self-attention by its module path (a
decoder-only model's prefix view, whose module also shows a prompt view, is decoder
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
from attnaudit.capturing.sites import site_base
from attnaudit.record import AttentionRecord
from attnaudit.targets.contract import Batch

# The sites table's ``eligibility`` entry per role; any other role gets CAPTURED_RULE.
DECLARED_RULES = {
    "cross": "declared: real source tokens",
    "encoder_self": "declared: real source tokens",
    "decoder_self": "declared: causal",
}
CAPTURED_RULE = "captured key mask"


def site_role(name: str, kind: str | None, queries: int, keys: int, n_source: int,
              n_target: int, prefix_view: bool = False) -> str:
    """cross, encoder_self, decoder_self or captured (no declared rule fits); see module doc.

    prefix_view: the site is a decoder-only model's prefix view (its module also shows a
    prompt view, :mod:`attnaudit.capturing.views`): its queries are steps."""
    if (queries, keys) == (n_target, n_source) and (kind == "cross" or n_target != n_source):
        return "cross"
    if kind == "cross":
        return "captured"
    encoder = (queries, keys) == (n_source, n_source)
    decoder = (queries, keys) == (n_target, n_target)
    if encoder and decoder and prefix_view:
        return "decoder_self"
    if encoder and decoder:
        module = name.split(":", 1)[0].lower()
        encoder, decoder = "encoder" in module, "decoder" in module
        if encoder == decoder:
            return "captured"
    if encoder:
        return "encoder_self"
    if decoder:
        return "decoder_self"
    return "captured"


def site_roles(records: Mapping[str, AttentionRecord], n_source: int, n_target: int
               ) -> dict[str, str]:
    """Each record's role (:func:`site_role`) for one batch of ``n_source`` source positions
    and ``n_target`` emitted steps; a self-attention site whose module also shows a
    cross-attention (prompt) view is a prefix view."""
    return roles_of_shapes({name: (r.kind, *r.weights.shape[2:]) for name, r in records.items()},
                           n_source, n_target)


def roles_of_shapes(shapes: Mapping[str, tuple[str | None, int, int]], n_source: int,
                    n_target: int) -> dict[str, str]:
    """:func:`site_roles` from each site's (kind, stacked queries, keys)."""
    prompt_views = {site_base(n) for n, (kind, *_) in shapes.items() if kind == "cross"}
    return {name: site_role(name, kind, queries, keys, n_source, n_target,
                            kind == "self" and site_base(name) in prompt_views)
            for name, (kind, queries, keys) in shapes.items()}


def rows_of(declared: torch.Tensor | None, rows: torch.Tensor | None, role: str, start: int,
            stop: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """:func:`declared_rule`'s (eligible keys, rows that count) cut to a site's query rows
    ``start:stop`` (one call of it, when calls are analysed as they arrive)."""
    if declared is not None and role == "decoder_self":
        declared = declared[:, :, start:stop]
    return declared, None if rows is None else rows[:, start:stop]


def declared_rule(role: str, batch: Batch, step_mask: torch.Tensor
                  ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(eligible keys, bool (B, 1, Q or 1, K) or None; rows that count, bool (B, Q) or None)."""
    source = batch.source_mask.bool()
    if role == "cross":
        return source[:, None, None, :], step_mask
    if role == "encoder_self":
        return source[:, None, None, :], source
    if role == "decoder_self":
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
