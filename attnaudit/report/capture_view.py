"""The attention explorer for kept audit examples and for a bare capture
(:func:`attnaudit.show`): both become an :class:`~attnaudit.report.explorer_page.ExplorerPage`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from attnaudit.analysis.example_maps import ExampleMaps, example_maps
from attnaudit.analysis.numerics import row_sum_tolerance
from attnaudit.errors import ExplorerError
from attnaudit.record import AttentionRecord, Family, Role
from attnaudit.report.explorer import explorer_views, payload, site_tolerances
from attnaudit.report.explorer_page import ExplorerPage, standalone_page
from attnaudit.validity.analysers import DEFAULT_MAX_MASKED_MASS

KIND_ROLES = {"cross": Role.CROSS, "self": Role.SELF}  # the role of a site's kind


def examples_page(examples: Sequence[ExampleMaps], *, title: str,
                  max_masked_mass: float | None, sites: pd.DataFrame | None = None
                  ) -> ExplorerPage:
    """The explorer page of an audit's kept examples; ``sites``: the audit's sites table,
    whose ``row_sum_tolerance`` column sets each site's row-sum check."""
    data = payload(explorer_views(examples), max_masked_mass=max_masked_mass,
                   row_sum_tolerance=site_tolerances(sites), csv=None)
    return ExplorerPage(standalone_page(data, title))


def show(capture_or_record: Any, tokens: Sequence[object] | None = None, *,
         query_tokens: Sequence[object] | None = None, example: int = 0,
         measures: Mapping[str, Mapping[str, Any]] | None = None,
         title: str = "Captured attention") -> ExplorerPage:
    """The attention explorer for a capture, without an audit: one example of every
    captured site, in a notebook (the result renders inline) or saved as one HTML file.

    Args:
        capture_or_record: a :class:`~attnaudit.Capture` (its records), one
            :class:`~attnaudit.AttentionRecord`, or a mapping of site name to record.
        tokens: the key labels (and the query labels of self-attention) when their count
            matches the keys; positions are labelled by index otherwise.
        query_tokens: the query labels of cross-attention (emitted or target tokens).
        example: the batch row drawn.
        measures: more per-cell measures to show beside the weights: name -> site ->
            array (heads or 1, queries, keys), e.g. value-norm contributions.
        title: the page's heading.

    Raises:
        ExplorerError: nothing captured, ``example`` out of range, or a measure whose
            shape does not fit its site's maps.
    """
    records = _records(capture_or_record)
    batch = {int(r.weights.shape[0]) for r in records.values()}
    if isinstance(example, bool) or not isinstance(example, int) \
            or not 0 <= example < min(batch):
        raise ExplorerError(f"example {example!r} is not a row of the captured batch of "
                            f"{min(batch)}")
    # every query and key kept (no source or steps to trim to), then named by the role
    # capture gave the site (a prompt view's), else by its kind
    maps = example_maps(records, dict.fromkeys(records, Role.CAPTURED), "", [], [],
                        torch.zeros(0, dtype=torch.bool), torch.zeros(0, dtype=torch.bool),
                        example=example, declared={})
    if any(r.site.role is not None for r in records.values()):
        maps.family = Family.DECODER_ONLY  # only prompt views carry a role from capture
    for name, amap in maps.maps.items():
        site = records[name].site
        amap.role = site.role or KIND_ROLES.get(site.kind or "", Role.CAPTURED)
        queries, keys = amap.weights.shape[1:]
        amap.key_labels = _labels(tokens, keys, amap.key_labels)
        if amap.top_keys is not None:  # a long key axis: the tokens its zoom shows
            top = amap.top_keys
            top.tokens = _labels(tokens, len(top.tokens), top.tokens)
        amap.query_labels = _labels(query_tokens if amap.role == "cross" else tokens,
                                    queries, amap.query_labels)
        for measure, per_site in (measures or {}).items():
            if name in per_site:
                amap.measures[measure] = _measure(measure, name, per_site[name], amap.weights)
    maps.source = title
    tolerances = {name: row_sum_tolerance(r.weights.dtype, int(r.weights.shape[-1]))
                  for name, r in records.items()}
    data = payload(explorer_views([maps]), max_masked_mass=DEFAULT_MAX_MASKED_MASS,
                   row_sum_tolerance=tolerances, csv=None)
    return ExplorerPage(standalone_page(data, title))


def _records(source: Any) -> dict[str, AttentionRecord]:
    if isinstance(source, AttentionRecord):
        records = {source.name: source}
    else:
        found = getattr(source, "records", source)
        if not isinstance(found, Mapping) or not all(
                isinstance(r, AttentionRecord) for r in found.values()):
            raise ExplorerError("show() takes a Capture, an AttentionRecord or a mapping of "
                                f"site names to records, got {type(source).__name__}")
        records = dict(found)
    records = {n: r for n, r in records.items() if r.calls}
    if not records:
        raise ExplorerError("nothing was captured: run the model inside the capture first")
    return records


def _labels(tokens: Sequence[object] | None, count: int, default: list[str]) -> list[str]:
    return [str(t) for t in tokens] if tokens is not None and len(tokens) == count else default


def _measure(measure: str, site: str, values: Any, weights: np.ndarray) -> np.ndarray:
    array = np.asarray(values.detach().float().cpu() if isinstance(values, torch.Tensor)
                       else values, dtype=np.float32)
    if array.ndim != 3 or array.shape[0] not in (1, weights.shape[0]) \
            or array.shape[1:] != weights.shape[1:]:
        raise ExplorerError(f"measure {measure!r} at {site}: shape {array.shape} does not fit "
                            f"the maps' (heads or 1, queries, keys) = {weights.shape}")
    return array
