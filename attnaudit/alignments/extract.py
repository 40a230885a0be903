"""Links from an importance map: for each target unit, the source unit it gives the most to.

A map is (T, S) per example: query row = step, column = source position (attention weights,
a contribution, an attribution score: larger = more). Source positions are summed into
source units (a word's score is the sum of its tokens', as the report's word tables do) and
a target unit's rows (its tokens' steps under the step convention) are summed too; the
unit is linked to the source unit with the largest sum (the first on a tie). A target unit
with no row, or whose sums are all equal or not finite (no information to pick one), gets
no link.
"""

from __future__ import annotations

import torch

from attnaudit.alignments.pharaoh import Alignment
from attnaudit.alignments.units import Units
from attnaudit.analysis.aggregation import aggregate
from attnaudit.errors import AlignmentError


def links_from_maps(maps: torch.Tensor, units: Units) -> list[Alignment]:
    """One alignment per example from ``maps`` (B, T, S) float and the batch's ``units``."""
    if maps.ndim != 3 or maps.shape[0] != units.source.shape[0] \
            or maps.shape[2] != units.source.shape[1]:
        raise AlignmentError(f"maps must be (B, T, S) = ({units.source.shape[0]}, T, "
                             f"{units.source.shape[1]}), got {tuple(maps.shape)}")
    out = []
    for b, per_unit in enumerate(units.rows):
        n_source = units.n_source[b]
        if n_source == 0:
            out.append(Alignment())
            continue
        per_source = aggregate(maps[b].detach().cpu().double(), units.source[b], n_source)
        links = []
        for unit, steps in enumerate(per_unit):
            if not steps:
                continue
            scores = per_source[steps].sum(0)  # (n_source,)
            undecided = n_source > 1 and bool(scores.max() == scores.min())
            if undecided or not bool(torch.isfinite(scores).all()):
                continue
            links.append((int(scores.argmax()), unit))
        out.append(Alignment.of(links))
    return out
