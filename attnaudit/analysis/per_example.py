"""Per-example rows, kept only when asked for (``Analyser(per_example=True)``).

Unlike :class:`~attnaudit.analysis.stats.RowStats`, this table grows with the data: one
value per example x site x head x query step x metric. Examples are numbered per site in
arrival order — the b-th example of a site's n-th update is ``examples before it + b`` —
so when every batch updates each site once, one example has the same number at every
site. Merging appends the other shard's examples after this one's, renumbered, as if its
batches had been fed after these.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pandas as pd
import torch

from attnaudit.analysis.stats import layer_of

COLUMNS = ["example", "site", "kind", "layer", "head", "step", "metric", "value"]


class ExampleRows:
    """A growing table of per-row metric values, keyed by site and metric."""

    def __init__(self) -> None:
        # (site, metric) -> chunks of (example, head, step, value) arrays, each 1-D
        self.chunks: dict[tuple[str, str], list[tuple[np.ndarray, ...]]] = defaultdict(list)
        self.seen: dict[str, int] = {}  # examples numbered so far, per site
        self.kinds: dict[str, str | None] = {}

    def reset(self) -> None:
        self.chunks.clear()
        self.seen.clear()
        self.kinds.clear()

    def add(self, site: str, kind: str | None, metric: str, values: torch.Tensor,
            defined: torch.Tensor, step_offset: int = 0) -> None:
        """Keep the finite values of defined rows; ``values`` and ``defined`` are (B, H, Q).

        The batch's examples are numbered from the site's current count; call
        :meth:`advance` once the whole batch is in.
        """
        self.kinds.setdefault(site, kind)
        array = values.detach().to(torch.float64).cpu().numpy()
        keep = defined.expand(array.shape).cpu().numpy() & np.isfinite(array)
        example, head, step = np.nonzero(keep)
        self.chunks[(site, metric)].append(
            (example + self.seen.get(site, 0), head, step + step_offset, array[keep]))

    def advance(self, site: str, batch: int) -> None:
        """The site's next update numbers its examples after these ``batch`` ones."""
        self.seen[site] = self.seen.get(site, 0) + batch

    def merge(self, other: ExampleRows) -> None:
        for (site, metric), chunks in other.chunks.items():
            shift = self.seen.get(site, 0)
            self.chunks[(site, metric)].extend(
                (example + shift, head, step, value.copy())
                for example, head, step, value in chunks)
        for site, count in other.seen.items():
            self.seen[site] = self.seen.get(site, 0) + count
        for site, kind in other.kinds.items():
            self.kinds.setdefault(site, kind)

    def frame(self) -> pd.DataFrame:
        """Tidy rows: example, site, kind, layer, head, step, metric, value."""
        parts = []
        for (site, metric), chunks in self.chunks.items():
            if not chunks:
                continue
            example, head, step, value = (np.concatenate(a) for a in zip(*chunks, strict=True))
            parts.append(pd.DataFrame({
                "example": example.astype(np.int64), "site": site,
                "kind": self.kinds.get(site), "layer": layer_of(site),
                "head": head.astype(np.int64), "step": step.astype(np.int64),
                "metric": metric, "value": value}))
        parts = [p for p in parts if len(p)]
        if not parts:
            frame = pd.DataFrame({c: pd.Series(dtype=t) for c, t in zip(
                COLUMNS, ["int64", object, object, "Int64", "int64", "int64", object,
                          "float64"], strict=True)})
        else:
            frame = pd.concat(parts, ignore_index=True)
        frame["layer"] = frame["layer"].astype("Int64")
        return frame.sort_values(["site", "metric", "example", "head", "step"],
                                 ignore_index=True)
