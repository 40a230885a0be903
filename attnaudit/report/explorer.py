"""The attention explorer's data: kept examples' maps grouped into views, written once as a
CSV and once, compactly, as the page's payload.

A *view* is one role of attention in one example (encoder self-attention, decoder
self-attention, cross-attention; a decoder-only model's continuation over its prompt and
over itself) with its sites stacked as layers, in site order. Each map's role comes from
the audit (:class:`~attnaudit.record.Role`), and its title from the target's family
(:func:`~attnaudit.targets.contract.role_title`): the page shows what Python passes it.
Each view holds every *measure* the audit computed, each a ``(layers, heads or 1, queries,
keys)`` float32 array: ``weights`` always, and every array in :attr:`AttentionMap.measures
<attnaudit.analysis.example_maps.AttentionMap.measures>` under its own name (value-norm
contributions, attributions...), which the page shows without any change to its script.

:func:`explorer_views` builds the views; :func:`maps_frame` (``attention_maps.csv``) and
:func:`payload` (the page) both read them, so the page and the CSV hold the same numbers.
The payload encodes each measure as base64 little-endian float32 (``f32``) while the
page's data stays within :data:`PAYLOAD_BUDGET`, else as 8 bits per cell with a scale per
(layer, head) map (``u8``: ``lo + q * step``, q = 255 for a missing value). The page draws
at most 256 queries by 256 keys at once; longer sequences are shown through a moving
window, never cut. The maps themselves are exact up to
:data:`~attnaudit.analysis.example_maps.MAX_MAP_SIDE` (512) positions per axis and averaged
in runs past that (:class:`~attnaudit.analysis.example_maps.MapBuilder`).

Long prompts (a key axis past 512 tokens, e.g. a decoder-only continuation over a prompt of
1k-32k tokens): the view's map is an overview of block means (at most 128 blocks of a
power-of-two number of tokens, :mod:`attnaudit.analysis.long_keys`) and, for every exact
query row of every layer and head, its top 8 keys, its weight on key 0 (the sink) and on
sink columns, kept exactly as float32 (:class:`LongKeys`, always ``f32`` in the page,
written to ``attention_top_keys.csv`` by :func:`top_keys_frame`). The page zooms into any
block at token resolution: a kept key shows its exact weight, every other key the block
mean, marked as such. Such a page's map data is ``f32`` while it fits
:data:`LONG_PAYLOAD_BUDGET` (20 MB). Measured (``python -m benchmarks.long_prompt_page``): an
8,192-token prompt continued for 32 steps on a 16-layer x 32-head model gives an explorer of
13.1 MB; it grows linearly in layers x heads x steps (802 bytes per layer, head and step at
8k tokens: 128 block means, 8 top keys and key 0), so 20 MB holds 48 continuation steps of
that model. Past the budget (more steps or examples) the block means are stored with 8 bits
(``u8``, marked approximate); the kept keys stay exact.

The page opens where the information is (:func:`opening`): on the cell a validity finding
points at when a kept map has one, else on the first example's cross-attention view (a
decoder-only model's continuation over its prompt), on the (layer, head) whose attention is
the most concentrated: the highest *mean max weight*, the mean over every query row of every
kept example's map of that view of the row's largest weight.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from attnaudit.analysis.example_maps import ExampleMaps
from attnaudit.analysis.long_keys import TopKeys
from attnaudit.errors import ExplorerError
from attnaudit.record import Family, Role
from attnaudit.report.figures import visible_token
from attnaudit.targets.contract import role_title

DEFAULT_EXAMPLES = 5  # the report's ``--explorer-examples``
PAYLOAD_BUDGET = 2_500_000  # base64 bytes of map data in one page: the page stays <= 3 MB
LONG_PAYLOAD_BUDGET = 20_000_000  # ... in a page with a long key axis (module docstring)
CSV_NAME = "attention_maps.csv"
TOP_KEYS_CSV = "attention_top_keys.csv"
WEIGHTS = "weights"
ROLE_ORDER = (Role.ENCODER_SELF, Role.DECODER_SELF, Role.SELF, Role.CROSS, Role.CAPTURED)
QUERY_AXES: dict[str, str] = {Role.ENCODER_SELF: "Query token"}  # the page's query slider, by role
STEP_AXIS = "Decoding step"  # ... of every other role: its queries are output steps
MAP_COLUMNS = ["example", "view", "measure", "site", "layer", "head", "query", "key",
               "query_token", "key_token", "eligible", "value"]
TOP_KEY_COLUMNS = ["example", "view", "site", "layer", "head", "query", "query_token",
                   "kind", "rank", "key", "key_token", "block", "value"]
TOP, FIRST, SINK = "top", "key 0", "sink columns"  # the kinds of attention_top_keys.csv rows
U8_MISSING = 255
U8_LEVELS = 254
OPENING_STATISTIC = "mean max weight"
PLAIN_AXES = ("queries", "keys")
AXES: dict[tuple[Family | None, str], tuple[str, str]] = {  # what a map's rows and columns are
    (Family.ENCODER_DECODER, Role.ENCODER_SELF): ("source tokens", "source tokens"),
    (Family.ENCODER_DECODER, Role.DECODER_SELF): ("emitted steps", "decoder inputs"),
    (Family.ENCODER_DECODER, Role.CROSS): ("emitted steps", "source tokens"),
    (Family.DECODER_ONLY, Role.PROMPT): ("continuation steps", "prompt tokens"),
    (Family.DECODER_ONLY, Role.CONTINUATION): ("continuation steps", "continuation inputs"),
    (Family.DECODER_ONLY, Role.SELF): ("tokens", "earlier tokens"),
}


@dataclass
class LongKeys:
    """A view's exact keys beside its block means (:class:`~attnaudit.analysis.long_keys.
    TopKeys` of its sites stacked as layers).

    block: tokens per block. tokens: a label per key token. index: int64 (layers, heads,
    queries, k), value: float32, the same shape. first: float32 (layers, heads, queries),
    the weight on key 0. sink: float32 (layers, heads, queries) or None.
    """

    block: int
    tokens: list[str]
    index: np.ndarray
    value: np.ndarray
    first: np.ndarray
    sink: np.ndarray | None


@dataclass
class View:
    """One role of attention in one example, its sites stacked as layers.

    title: the role's title in the target's family. query_axis: what its queries are
    (``Query token``, ``Decoding step``). axes: what the map's rows and columns are in the
    target's family (:data:`AXES`; ``queries``, ``keys`` where it names none).
    query_labels, key_labels: the tokens as the target names them (the page draws their
    spaces visible). measures: name -> float32
    (layers, heads or 1, queries, keys); NaN where a site lacks the measure. eligible:
    bool (layers, heads, queries, keys) or None (not known). row_sum, masked_mass: float64
    (layers, heads, queries) or None. long: the exact keys kept beside a long key axis's
    block means, or None (the key axis is exact).
    """

    name: str
    role: str
    title: str
    query_axis: str
    sites: list[str]
    query_labels: list[str]
    key_labels: list[str]
    measures: dict[str, np.ndarray]
    eligible: np.ndarray | None = None
    row_sum: np.ndarray | None = None
    masked_mass: np.ndarray | None = None
    axes: tuple[str, str] = PLAIN_AXES
    long: LongKeys | None = None


@dataclass
class ExampleViews:
    """One kept example: its position in the data, its source text and its views."""

    index: int
    source: str
    views: list[View] = field(default_factory=list)


def explorer_views(examples: Sequence[ExampleMaps]) -> list[ExampleViews]:
    """Each example's maps grouped into views (module docstring). Sites of one role with
    different head counts or shapes go to separate views (``cross``, ``cross 2``...);
    empty maps (no real token) are left out."""
    out = []
    for example in examples:
        groups: dict[tuple[str, int, int, int], list[str]] = {}
        for site, amap in example.maps.items():
            if 0 not in amap.weights.shape:
                groups.setdefault((amap.role, *amap.weights.shape), []).append(site)
        views: list[View] = []
        seen: dict[str, int] = {}
        for key in sorted(groups, key=lambda k: ROLE_ORDER.index(k[0])
                          if k[0] in ROLE_ORDER else len(ROLE_ORDER)):
            role = key[0]
            seen[role] = seen.get(role, 0) + 1
            name = role if seen[role] == 1 else f"{role} {seen[role]}"
            views.append(_view(example, name, role, groups[key]))
        out.append(ExampleViews(example.index, example.source, views))
    return out


def _view(example: ExampleMaps, name: str, role: str, sites: list[str]) -> View:
    maps = [example.maps[s] for s in sites]
    first = maps[0]
    names = [WEIGHTS, *dict.fromkeys(n for m in maps for n in m.measures)]
    measures = {n: _stack([m.weights if n == WEIGHTS else m.measures.get(n) for m in maps],
                          first.weights.shape) for n in names}
    title = role_title(example.family, role)
    return View(name, role, title, QUERY_AXES.get(role, STEP_AXIS), sites,
                list(first.query_labels), list(first.key_labels), measures,
                _stack_known([m.eligible for m in maps]),
                _stack_known([m.row_sum for m in maps]),
                _stack_known([m.masked_mass for m in maps]),
                AXES.get((example.family, role), PLAIN_AXES),
                _long_keys([m.top_keys for m in maps]))


def _long_keys(kept: list[TopKeys | None]) -> LongKeys | None:
    """The layers' top keys stacked; None unless every layer has them."""
    if not kept or any(k is None for k in kept):
        return None
    known = [k for k in kept if k is not None]
    sinks = [k.sink for k in known]
    sink = None
    if any(s is not None for s in sinks):
        sink = np.stack([np.full(k.first.shape, np.nan, np.float32) if k.sink is None
                         else k.sink for k in known])
    return LongKeys(known[0].block, list(known[0].tokens), np.stack([k.index for k in known]),
                    np.stack([k.value for k in known]), np.stack([k.first for k in known]),
                    sink)


def _stack_known(arrays: list[np.ndarray | None]) -> np.ndarray | None:
    """The layers' arrays stacked on a new first axis; None when a layer's is not known."""
    known = [a for a in arrays if a is not None]
    return np.stack(known) if len(known) == len(arrays) else None


def _stack(arrays: list[np.ndarray | None], shape: tuple[int, ...]) -> np.ndarray:
    """(layers, heads or 1, Q, K) float32; a missing layer is NaN. Single-head measures
    stay single-head; a mix with per-head ones is broadcast to every head."""
    heads = max((a.shape[0] for a in arrays if a is not None), default=1)
    out = np.full((len(arrays), heads, *shape[1:]), np.nan, dtype=np.float32)
    for layer, array in enumerate(arrays):
        if array is not None:
            if array.ndim != 3 or array.shape[1:] != shape[1:]:
                raise ExplorerError(f"a measure of shape {array.shape} does not fit maps of "
                                 f"shape {shape} (heads or 1, queries, keys)")
            out[layer] = array
    return out


def maps_frame(examples: Sequence[ExampleViews]) -> pd.DataFrame:
    """``attention_maps.csv``: one row per example, view, measure, layer, head, query and
    key (columns :data:`MAP_COLUMNS`); ``value`` is the float32 number the page shows,
    exactly (as float64), ``eligible`` empty where not known."""
    frames = []
    for example in examples:
        for view in example.views:
            for measure, array in view.measures.items():
                frames.append(_measure_rows(example.index, view, measure, array))
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in MAP_COLUMNS})
    return pd.concat(frames, ignore_index=True)[MAP_COLUMNS]


def _measure_rows(example: int, view: View, measure: str, array: np.ndarray) -> pd.DataFrame:
    heads = array.shape[1]
    layer, head, query, key = (i.ravel() for i in np.indices(array.shape))
    eligible: Any = pd.Series(pd.NA, index=range(array.size), dtype="boolean")
    if view.eligible is not None:
        eligible = np.broadcast_to(view.eligible[:, :heads], array.shape).ravel()
    return pd.DataFrame({
        "example": example, "view": view.name, "measure": measure,
        "site": np.asarray(view.sites, dtype=object)[layer], "layer": layer, "head": head,
        "query": query, "key": key,
        "query_token": np.asarray(view.query_labels, dtype=object)[query],
        "key_token": np.asarray(view.key_labels, dtype=object)[key],
        "eligible": eligible, "value": array.ravel().astype(np.float64)})


def top_keys_frame(examples: Sequence[ExampleViews]) -> pd.DataFrame:
    """``attention_top_keys.csv``: per example, long view, layer, head and query row, its
    top keys (``kind`` ``top``, ``rank`` 0 the largest), its weight on key 0 (``key 0``) and,
    where the model has them, on its sink columns (``sink columns``, no key); ``key`` is the
    token's position on the key axis, ``block`` its cell in ``attention_maps.csv`` (whose
    value there is the block mean) and ``value`` the float32 weight the page shows, exactly.
    """
    frames = []
    for example in examples:
        for view in example.views:
            if view.long is not None:
                frames.append(_top_rows(example.index, view, view.long))
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in TOP_KEY_COLUMNS})
    return pd.concat(frames, ignore_index=True)[TOP_KEY_COLUMNS]


def _top_rows(example: int, view: View, long: LongKeys) -> pd.DataFrame:
    tokens = np.asarray(long.tokens, dtype=object)
    parts = []
    kinds: list[tuple[str, np.ndarray, np.ndarray]] = [
        (TOP, long.index, long.value),
        (FIRST, np.zeros((*long.first.shape, 1), np.int64), long.first[..., None])]
    if long.sink is not None:
        kinds.append((SINK, np.full((*long.sink.shape, 1), -1), long.sink[..., None]))
    for kind, index, value in kinds:
        layer, head, query, rank = (i.ravel() for i in np.indices(index.shape))
        key = index.ravel()
        parts.append(pd.DataFrame({
            "example": example, "view": view.name,
            "site": np.asarray(view.sites, dtype=object)[layer], "layer": layer,
            "head": head, "query": query,
            "query_token": np.asarray(view.query_labels, dtype=object)[query],
            "kind": kind, "rank": rank if kind == TOP else 0,
            "key": pd.Series(key, dtype="Int64").mask(key < 0),
            "key_token": np.where(key >= 0, tokens[np.maximum(key, 0)], ""),
            "block": pd.Series(key // long.block, dtype="Int64").mask(key < 0),
            "value": value.ravel().astype(np.float64)}))
    return pd.concat(parts, ignore_index=True)


def site_tolerances(sites: pd.DataFrame | None) -> dict[str, float]:
    """Each site's row-sum tolerance from an audit's sites table (empty without one)."""
    if sites is None or "row_sum_tolerance" not in sites.columns:
        return {}
    return dict(zip(sites["site"], sites["row_sum_tolerance"], strict=True))


def payload(examples: Sequence[ExampleViews], *, max_masked_mass: float | None,
            row_sum_tolerance: Mapping[str, float], budget: int = PAYLOAD_BUDGET,
            csv: str | None = CSV_NAME) -> dict[str, Any]:
    """The page's data (JSON-ready): every example's views, each measure encoded as
    ``f32`` when the whole fits ``budget`` base64 bytes, else ``u8``; the rows that fail
    the masked-mass or row-sum check (at ``max_masked_mass`` and each site's
    ``row_sum_tolerance``) and the cells of ineligible keys that received weight; ``csv``:
    the file holding the same values, which the page names (None: there is none), beside
    :data:`TOP_KEYS_CSV` where a view has a long key axis."""
    cells = sum(a.size for e in examples for v in e.views for a in v.measures.values())
    if any(v.long is not None for e in examples for v in e.views):
        budget = max(budget, LONG_PAYLOAD_BUDGET)
    encoding = "f32" if math.ceil(cells * 4 / 3) <= budget else "u8"
    pages = [{"index": e.index, "source": e.source,
              "views": [_view_payload(v, encoding, max_masked_mass, row_sum_tolerance)
                        for v in e.views]} for e in examples]
    long = any(v.long is not None for e in examples for v in e.views)
    return {"version": 1, "encoding": encoding, "csv": csv,
            "top_keys_csv": TOP_KEYS_CSV if long and csv is not None else None,
            "max_masked_mass": max_masked_mass, "opening": opening(examples, pages),
            "examples": pages}


def mean_max_weight(examples: Sequence[ExampleViews], name: str) -> tuple[np.ndarray, int]:
    """Each (layer, head)'s mean over query rows of the row's largest weight, float64
    (layers, heads), over every example's view called ``name`` whose shape is the first
    one's (rows without a finite weight left out); and how many examples that is. A view
    with a long key axis reads each row's largest weight exactly, from its kept top key,
    not from its block means."""
    views = [v for e in examples for v in e.views if v.name == name]
    views = [v for v in views
             if v.measures[WEIGHTS].shape[:2] == views[0].measures[WEIGHTS].shape[:2]]
    weights = [v.measures[WEIGHTS] if v.long is None else v.long.value[..., :1]
               for v in views]
    finite = [np.isfinite(w).any(-1) for w in weights]  # (layers, heads, queries)
    peaks = [np.where(f, np.nanmax(np.where(f[..., None], w, 0.0), -1), 0.0)
             for w, f in zip(weights, finite, strict=True)]
    rows = sum(f.sum(-1) for f in finite)
    total = sum(p.sum(-1, dtype=np.float64) for p in peaks)
    return np.where(rows > 0, total / np.maximum(rows, 1), -np.inf), len(weights)


def opening(examples: Sequence[ExampleViews], pages: Sequence[Mapping[str, Any]]
            ) -> dict[str, Any]:
    """Where the page opens (module docstring): example, view, layer, head, step and key
    (positions in ``pages``, the payload's examples), with the reason in words and, when
    chosen by concentration, the statistic and its value."""
    for e, page in enumerate(pages):
        for v, view in enumerate(page["views"]):
            if view["masked_cells"]:
                layer, head, query, key = view["masked_cells"][0]
                return {"example": e, "view": v, "layer": layer, "head": head, "step": query,
                        "key": key, "reason": "an ineligible key that received weight"}
            if view["failing_rows"]:
                row = view["failing_rows"][0]
                return {"example": e, "view": v, "layer": row["layer"], "head": row["head"],
                        "step": row["query"], "key": 0,
                        "reason": "a row that fails the " + " and ".join(row["checks"])
                                  + " check"}
    views = examples[0].views if examples else []
    v = next((i for i, view in enumerate(views) if view.role == Role.CROSS), 0)
    out: dict[str, Any] = {"example": 0, "view": v, "layer": 0, "head": 0, "step": 0,
                           "key": 0, "reason": "the first map"}
    if views:
        concentration, count = mean_max_weight(examples, views[v].name)
        layer, head = np.unravel_index(int(np.argmax(concentration)), concentration.shape)
        value = float(concentration[layer, head])
        out.update(layer=int(layer), head=int(head), statistic=OPENING_STATISTIC,
                   value=_number(value), reason=f"the most concentrated (the highest "
                   f"{OPENING_STATISTIC}, {format(value, '.4g')}, over the query rows of "
                   f"{count} example{'' if count == 1 else 's'})")
    return out


def _view_payload(view: View, encoding: str, max_masked_mass: float | None,
                  row_sum_tolerance: Mapping[str, float]) -> dict[str, Any]:
    weights = view.measures[WEIGHTS]
    out: dict[str, Any] = {
        "name": view.name, "role": view.role, "title": view.title,
        "query_axis": view.query_axis, "axes": list(view.axes), "sites": view.sites,
        "queries": [visible_token(t) for t in view.query_labels],
        "keys": [visible_token(t) for t in view.key_labels],
        "shape": list(weights.shape),
        "measures": {n: encode(a, encoding) for n, a in view.measures.items()},
        "ineligible": None, "masked_cells": [], "failing_rows": [],
        "long": None if view.long is None else _long_payload(view.long)}
    if view.eligible is None or view.row_sum is None or view.masked_mass is None:
        return out  # the three are known together or not at all
    out["ineligible"] = _bits(~view.eligible)
    masked = np.argwhere(~view.eligible & (weights > 0))
    out["masked_cells"] = masked.tolist()
    tolerance = np.array([row_sum_tolerance.get(s, np.inf) for s in view.sites])[:, None, None]
    sum_bad = ~(np.abs(view.row_sum - 1.0) <= tolerance)  # NaN sums fail too
    mass_bad = (np.greater(view.masked_mass, max_masked_mass) if max_masked_mass is not None
                else np.zeros_like(sum_bad))
    for layer, head, query in np.argwhere(sum_bad | mass_bad):
        out["failing_rows"].append({
            "layer": int(layer), "head": int(head), "query": int(query),
            "row_sum": _number(view.row_sum[layer, head, query]),
            "masked_mass": _number(view.masked_mass[layer, head, query]),
            "checks": [name for name, bad in (("row sum", sum_bad), ("masked mass", mass_bad))
                       if bad[layer, head, query]]})
    return out


def _long_payload(long: LongKeys) -> dict[str, Any]:
    """A view's kept keys as the page reads them: base64 little-endian int32 positions and
    float32 weights, C order (layers, heads, queries, k) and (layers, heads, queries)."""
    def b64(array: np.ndarray, dtype: str) -> str:
        return base64.b64encode(np.ascontiguousarray(array, dtype=dtype).tobytes()
                                ).decode("ascii")

    return {"block": long.block, "k": int(long.index.shape[-1]),
            "tokens": [visible_token(t) for t in long.tokens],
            "index": b64(long.index, "<i4"), "value": b64(long.value, "<f4"),
            "first": b64(long.first, "<f4"),
            "sink": None if long.sink is None else b64(long.sink, "<f4")}


def _number(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def _bits(mask: np.ndarray) -> dict[str, Any]:
    """A bool array as base64 of its C-order bits, most significant bit first."""
    return {"shape": list(mask.shape),
            "bits": base64.b64encode(np.packbits(mask.ravel()).tobytes()).decode("ascii")}


def encode(array: np.ndarray, encoding: str) -> dict[str, Any]:
    """One measure (layers, heads, Q, K) as the page reads it (module docstring)."""
    layers, heads = array.shape[:2]
    if encoding == "f32":
        data = np.ascontiguousarray(array, dtype="<f4").tobytes()
        return {"heads": heads, "encoding": "f32",
                "data": base64.b64encode(data).decode("ascii")}
    flat = array.reshape(layers * heads, -1).astype(np.float64)
    finite = np.isfinite(flat)
    lo = np.where(finite, flat, np.inf).min(1, initial=np.inf)
    hi = np.where(finite, flat, -np.inf).max(1, initial=-np.inf)
    lo, hi = np.where(np.isfinite(lo), lo, 0.0), np.where(np.isfinite(hi), hi, 0.0)
    step = np.where(hi > lo, (hi - lo) / U8_LEVELS, 1.0)
    levels = np.rint((np.where(finite, flat, lo[:, None]) - lo[:, None]) / step[:, None])
    quantised = np.where(finite, levels, U8_MISSING).astype(np.uint8)
    return {"heads": heads, "encoding": "u8", "lo": lo.tolist(), "step": step.tolist(),
            "data": base64.b64encode(quantised.tobytes()).decode("ascii")}


def decode(measure: Mapping[str, Any], shape: Sequence[int]) -> np.ndarray:
    """The array :func:`encode` wrote, as the page reads it back: (layers, heads, Q, K)."""
    layers, _, queries, keys = shape
    raw = base64.b64decode(measure["data"])
    full = (layers, measure["heads"], queries, keys)
    if measure["encoding"] == "f32":
        return np.frombuffer(raw, dtype="<f4").reshape(full)
    levels = np.frombuffer(raw, dtype=np.uint8).reshape(layers * measure["heads"], -1)
    values = (np.asarray(measure["lo"])[:, None]
              + levels * np.asarray(measure["step"])[:, None])
    return np.where(levels == U8_MISSING, np.nan, values).reshape(full)
