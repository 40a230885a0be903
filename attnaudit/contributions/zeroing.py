"""Value zeroing (Mohebbi et al. 2023): how much does a layer's output move when one key's
value is zeroed in every head of one attention site?

Zeroing v_j is the weight edit a_ij -> 0 for every query and head *without* renormalising
(the read Σ_j a_ij v_j loses exactly the term j), so it runs through capture's edit path: one
example's batch is repeated (K copies, at most :data:`COPIES` per pass), copy j zeroes key
j, and the pass is re-run. The score of key j for query i is the cosine distance
1 - cos(x̃_i^{¬j}, x_i) between the site's layer output (the first indexed module above the
site, e.g. the whole decoder layer) with and without the edit (``raw``). As in the paper, the
scores of a query row are then normalised to sum to one over the keys the row reads
(``normalised``: keys with zero weight in every head — padding, future positions — score 0,
their raw distance being re-run noise); a row whose distances are all 0 stays 0. The
normalisation is a positive factor per row, so a row's ranking of keys is the raw one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from attnaudit.capturing import capture
from attnaudit.contributions.trace import Trace, run_pass
from attnaudit.record import Site
from attnaudit.targets.contract import Batch

# Edited copies run in one pass: bounds the memory of a long source (a pass's logits alone
# are copies * steps * vocabulary numbers).
COPIES = 16


@dataclass(frozen=True)
class ZeroingScores:
    """One site's value-zeroing scores, (B, Q, K) float32 each: ``raw`` the distances
    1 - cos, ``normalised`` each query row divided by its sum over the keys it reads."""

    raw: torch.Tensor
    normalised: torch.Tensor


def normalise_rows(raw: torch.Tensor, reads: torch.Tensor) -> torch.Tensor:
    """Distances (B, Q, K) per query row divided by their sum over the keys the row reads
    (``reads`` (B, Q, K) bool); 0 on the other keys and on a row that sums to 0."""
    kept = raw.masked_fill(~reads, 0.0)
    total = kept.sum(-1, keepdim=True)
    return torch.where(total > 0, kept / total.clamp_min(torch.finfo(raw.dtype).tiny), 0.0)


def _zeroing(first: int) -> Callable[[Site, torch.Tensor, Any], torch.Tensor]:
    """The edit under which copy c of a chunk reads a zero value at key ``first + c``: that
    column of its weights is 0 (not renormalised)."""

    def edit(site: Site, weights: torch.Tensor, key_mask: Any) -> torch.Tensor:
        del site, key_mask
        copies = torch.arange(weights.shape[0], device=weights.device)
        edited = weights.clone()
        edited[copies, :, :, first + copies] = 0
        return edited

    return edit


def _layer_output(model: nn.Module, layer: str, run: Any) -> torch.Tensor:
    """The output (first tensor) of module ``layer`` while ``run()`` runs."""
    module = dict(model.named_modules())[layer]
    seen: list[torch.Tensor] = []

    def hook(mod: nn.Module, args: tuple, out: Any) -> None:
        first = out if isinstance(out, torch.Tensor) else out[0]
        if not seen:
            seen.append(first)

    handle = module.register_forward_hook(hook)
    try:
        run()
    finally:
        handle.remove()
    return seen[0]


def value_zeroing(trace: Trace, sites: Iterable[str]) -> dict[str, ZeroingScores]:
    """Per site: the cosine distance of query i's layer output when key j's value is zeroed,
    raw and normalised per row (module docstring)."""
    target, batch, emitted = trace.target, trace.batch, trace.emitted
    out: dict[str, ZeroingScores] = {}
    for name in sites:
        site = trace.sites[name]
        reference = trace.layer_outputs[site.layer].float()  # (B, Q, d)
        keys = int(site.weights.shape[-1])
        rows = []
        for b in range(len(batch)):
            distances = []
            for first in range(0, keys, COPIES):  # at most COPIES re-runs at once
                count = min(COPIES, keys - first)
                copies = batch.select([b]).repeat(count)
                repeated = emitted[b : b + 1].repeat(count, 1)

                def run(copies: Batch = copies, repeated: torch.Tensor = repeated,
                        name: str = name, first: int = first) -> None:
                    with torch.no_grad(), capture(target.model, [name], _zeroing(first),
                                                  kinds=target.kinds):
                        run_pass(target, copies, repeated)

                zeroed = _layer_output(target.model, site.layer, run).float()  # (c, Q, d)
                distances.append(1 - torch.nn.functional.cosine_similarity(
                    zeroed, reference[b][None], dim=-1))
            rows.append(torch.cat(distances).transpose(0, 1))  # (Q, K)
        raw = torch.stack(rows)
        reads = site.weights.detach().float().cpu().gt(0).any(1).to(raw.device)  # (B, Q, K)
        out[name] = ZeroingScores(raw, normalise_rows(raw, reads))
    return out
