"""The attention-sink table: per site and head, the key that takes the most attention.

For every example, head h's incoming mass of key j is its weight averaged over the example's
real query rows; the *top key* is the eligible key with the most. Per site and head the
table gives the top key's most common label and position over the batch, its mean ``share``,
``rows_over``: the fraction of all real query rows that put more than :data:`SINK_SHARE` on
it, ``special``: whether it is a special token in most examples, and ``value_norm_ratio``:
its ‖f_h(x_j)‖ (its value norm ‖v_j‖ where no output projection is known, said in
``norm_of``) over the mean over eligible keys, averaged over examples. A head is a ``sink``
when ``rows_over`` > 0.5: most queries put more than 0.3 of their mass on one key (Xiao et al.
2023; Gu et al. 2024). Sinks usually sit on special tokens with small value norms: much weight,
little contribution.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pandas as pd
import torch

from attnaudit.contributions.measures import Contributions
from attnaudit.record import Role

SINK_SHARE = 0.3
SINK_ROWS = 0.5
COLUMNS = ["site", "role", "head", "token", "position", "share", "rows_over", "special",
           "value_norm_ratio", "norm_of", "sink", "examples"]


@dataclass
class SiteKeys:
    """What the table needs of one site's keys and queries.

    weights: (B, H, Q, K). key_norms: (B, H, K) or None. query_mask: bool (B, Q), real query
    rows. key_mask: bool (B, K), eligible keys. special: bool (B, K). labels: per example, a
    label per key.
    """

    site: str
    role: str
    weights: torch.Tensor
    key_norms: torch.Tensor | None
    norm_of: str
    query_mask: torch.Tensor
    key_mask: torch.Tensor
    special: torch.Tensor
    labels: list[list[str]]


def sink_rows(keys: SiteKeys) -> list[dict[str, object]]:
    """One table row per head of the site (module docstring)."""
    weights = keys.weights.float()
    batch, heads, _, _ = weights.shape
    rows = keys.query_mask.to(weights.device).float()  # (B, Q)
    n_rows = rows.sum(-1).clamp_min(1)  # (B,)
    mass = (weights * rows[:, None, :, None]).sum(2) / n_rows[:, None, None]  # (B, H, K)
    eligible = keys.key_mask.to(weights.device)[:, None, :]
    top = mass.masked_fill(~eligible, float("-inf")).argmax(-1)  # (B, H)
    share = mass.gather(-1, top[..., None])[..., 0]
    at_top = weights.gather(-1, top[:, :, None, None].expand(-1, -1, weights.shape[2], 1))
    over = ((at_top[..., 0] > SINK_SHARE) & (rows[:, None] > 0)).sum(-1).float()  # (B, H)
    special = keys.special.to(weights.device).gather(1, top)  # (B, H)
    ratio = torch.full_like(share, float("nan"))
    if keys.key_norms is not None:
        norms = keys.key_norms.float()
        mean = (norms * eligible).sum(-1) / eligible.sum(-1).clamp_min(1)
        ratio = norms.gather(-1, top[..., None])[..., 0] / mean.clamp_min(1e-30)
    table = []
    for h in range(heads):
        labels = Counter(keys.labels[b][int(top[b, h])] for b in range(batch))
        positions = Counter(int(top[b, h]) for b in range(batch))
        rows_over = float(over[:, h].sum() / rows.sum().clamp_min(1))
        table.append({
            "site": keys.site, "role": keys.role, "head": h,
            "token": labels.most_common(1)[0][0], "position": positions.most_common(1)[0][0],
            "share": float(share[:, h].mean()), "rows_over": rows_over,
            "special": bool(special[:, h].float().mean() > 0.5),
            "value_norm_ratio": float(ratio[:, h].mean()), "norm_of": keys.norm_of,
            "sink": rows_over > SINK_ROWS, "examples": batch})
    return table


def sink_frame(sites: list[SiteKeys]) -> pd.DataFrame:
    """The table over several sites (columns :data:`COLUMNS`)."""
    return pd.DataFrame([row for keys in sites for row in sink_rows(keys)], columns=COLUMNS)


def _keys_of(result: Contributions, name: str) -> SiteKeys:
    traced = result.trace
    site = traced.sites[name]
    target, batch, emitted = traced.target, traced.batch, traced.emitted
    source_labels = [[str(t) for t in row] for row in target.source_tokens(batch)]
    prefix_labels = [["<start>"] + [str(t) for t in row[:-1]]
                     for row in target.target_tokens(emitted)]
    if site.role == Role.SELF:  # decoder-only: prompt, then the generated prefix
        labels = [s + p[1:] for s, p in zip(source_labels, prefix_labels, strict=True)]
        key_mask = traced.query_mask[Role.SELF]
    elif site.role == Role.DECODER_SELF:
        labels, key_mask = prefix_labels, traced.query_mask[Role.DECODER_SELF]
    else:
        labels, key_mask = source_labels, batch.source_mask.bool()
    ids = traced.key_ids[site.role]
    special = ids == -1
    for token in target.special_ids:
        special |= ids == token
    vectors = result.value_norms.get(name)
    if vectors is not None:
        norms, norm_of = vectors.key_norms, "f_h(x_j)"
    elif site.values is not None:
        norms, norm_of = site.values.norm(dim=-1), "v_j"
    else:
        norms, norm_of = None, "unavailable"
    rows, _, queries, keys = site.weights.shape
    query_mask = traced.query_mask[site.role]
    if tuple(query_mask.shape) != (rows, queries):  # queries not the role's: every row
        query_mask = torch.ones(rows, queries, dtype=torch.bool, device=site.weights.device)
    if tuple(key_mask.shape) != (rows, keys) or len(labels[0]) != keys:
        key_mask = torch.ones(rows, keys, dtype=torch.bool, device=site.weights.device)
        special = torch.zeros(rows, keys, dtype=torch.bool, device=site.weights.device)
        labels = [[str(k) for k in range(keys)] for _ in range(rows)]
    return SiteKeys(name, site.role, site.weights, norms, norm_of, query_mask, key_mask,
                    special, labels)


def sink_table(result: Contributions) -> pd.DataFrame:
    """The sink table of every traced site of one batch (module docstring)."""
    return sink_frame([_keys_of(result, name) for name in result.trace.sites])
