"""The capture context: installs the adapters, routes every attention call to its record,
applies the user's edit, and leaves the model and torch exactly as it found them."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import replace
from types import TracebackType
from typing import Any
from weakref import WeakKeyDictionary

import torch
from torch import nn

from attnaudit.capturing import hf, logsumexp, mha, sdpa, softmax
from attnaudit.capturing.blocks import DEFAULT_MAX_MEMORY, parse_memory
from attnaudit.capturing.layout import CallSite, Layout, int_locals, module_heads, resolve_layout
from attnaudit.capturing.model_facts import PatternsArg, SiteRules, facts_for
from attnaudit.capturing.protocol import MhaCall, ValueEdit
from attnaudit.capturing.sites import SiteRegistry, SiteSelection, make_selector, site_base
from attnaudit.capturing.state import ACTIVE, compiled_code_runs_eagerly
from attnaudit.capturing.views import (
    VIEW_KINDS,
    View,
    active_views,
    position_stream,
    run_name,
    view_mask_source,
)
from attnaudit.errors import (
    CaptureError,
    CaptureOptionError,
    EditError,
    NoAttentionFound,
    SiteNotFound,
)
from attnaudit.record import AttentionCall, AttentionRecord, Kind, Site

Edit = Callable[[Site, torch.Tensor, torch.Tensor | None], torch.Tensor | None]
OnCall = Callable[[Site, AttentionCall], None]
LayoutKey = tuple[str, tuple[int, ...], int, int | None]  # site, shape, key axis, stated heads
# Layouts resolved per model, dropped with it.
_LAYOUTS: WeakKeyDictionary[nn.Module, dict[LayoutKey, Layout]] = WeakKeyDictionary()

SEARCHED = (
    "softmax calls (torch.softmax, F.softmax, Tensor.softmax) and exp(x - logsumexp(x)) "
    "from the model's methods, "
    "F.scaled_dot_product_attention calls, {n_mha} nn.MultiheadAttention module(s), "
    "and attnaudit.tap() calls"
)


class Capture:
    """Records attention weights while active; see :func:`capture`.

    Attributes:
        records: site name -> :class:`AttentionRecord`, in order of first call (empty
            with ``keep=False``).
        sites: every site name found (selected or not), in order of first call.
        recorded: site name -> its :class:`Site` (layout filled in), for every site a
            call was recorded at, kept or not.
        value_sites: the names of the sites at whose calls capture held the values (there
            a ``value_edit`` applies and ``values=True`` keeps them, except at prompt
            views), in order of first call.
    """

    def __init__(self, model: nn.Module, sites: SiteSelection = None, edit: Edit | None = None,
                 *, include: PatternsArg = None, exclude: PatternsArg = None,
                 roles: Mapping[str, Kind] | None = None,
                 kinds: Mapping[str, Kind] | None = None,
                 heads: Mapping[str, int] | None = None, scores: bool = False,
                 values: bool = False, allow_invalid: bool = False,
                 on_call: OnCall | None = None, keep: bool = True,
                 max_memory: int | str | None = None,
                 value_edit: ValueEdit | None = None) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"capture() needs a torch.nn.Module, got {type(model).__name__}")
        if isinstance(model, torch.jit.ScriptModule):
            raise CaptureError(
                f"{type(model).__name__} is a TorchScript module (torch.jit.trace / script): its "
                "graph runs without calling Python attention code, so there is nothing to "
                "capture or edit; capture the original nn.Module instead"
            )
        if edit is not None and not callable(edit):
            raise TypeError("edit must be a callable (site, weights, key_mask) -> weights")
        if on_call is not None and not callable(on_call):
            raise TypeError("on_call must be a callable (site, call) -> None")
        if value_edit is not None and not callable(value_edit):
            raise TypeError("value_edit must be a callable (site, weights, values) -> read")
        self.on_call = on_call
        self.keep = keep
        self.max_memory = DEFAULT_MAX_MEMORY if max_memory is None else parse_memory(max_memory)
        self.model = model
        self.edit = edit
        self.value_edit = value_edit
        self.keep_scores = scores
        self.keep_values = values
        self.allow_invalid = allow_invalid
        self.heads = _checked_heads(heads)
        select, self._requested = make_selector(sites)
        self._modules = list(model.named_modules())
        self._select = select
        self.sites_registry = SiteRegistry(
            self._modules, _view_aware(select), kinds, SiteRules.of(include, exclude, roles),
            facts_for(m for _, m in self._modules))
        self.records: dict[str, AttentionRecord] = {}
        self.recorded: dict[str, Site] = {}
        self._value_sites: dict[str, None] = {}  # an ordered set
        # the value reads of the call just recorded: its site, or each view's site and view
        self._reads: list[tuple[Site, View | None]] = []
        self._counts: dict[str, tuple[int, int]] = {}  # site -> (calls, queries) so far
        self.busy = False
        self.mha_stack: list[MhaCall] = []
        self._stack: ExitStack | None = None
        self._used = False
        self._owner_heads: dict[str, int | None] = {}
        self._layouts: dict[tuple[str, tuple[int, ...], int], Layout] = {}  # this capture's

    @property
    def sites(self) -> list[str]:
        return list(self.sites_registry.found)

    @property
    def value_sites(self) -> list[str]:
        return list(self._value_sites)

    def __enter__(self) -> Capture:
        if ACTIVE.capture is not None:
            raise CaptureError("another attnaudit capture is already active; captures do not nest")
        if self._used:
            raise CaptureError("a Capture is used once: its records belong to the first `with` "
                               "block; call attnaudit.capture(...) again for another run")
        modules = [m for _, m in self._modules]
        hf.check_backends(self._modules)
        self._used = True
        stack = ExitStack()
        try:
            compiled_code_runs_eagerly(stack)
            namespaces = _model_namespaces(modules)
            softmax.install(stack, namespaces)
            logsumexp.install(stack, namespaces)
            sdpa.install(stack, namespaces)
            mha.install(stack, self, modules)
            ACTIVE.capture = self
            stack.callback(setattr, ACTIVE, "capture", None)
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        assert self._stack is not None
        self._stack.close()
        self._stack = None
        self.busy = False
        self._reads = []
        self.mha_stack.clear()
        if exc_type is None:
            self._check_found()

    def _check_found(self) -> None:
        found = self.sites
        if not found:
            n_mha = sum(isinstance(m, nn.MultiheadAttention) for _, m in self._modules)
            raise NoAttentionFound(
                f"no attention site found in {type(self.model).__name__}: searched "
                + SEARCHED.format(n_mha=n_mha) + ". " + _traced_hint(self._modules)
                + "Was the model run inside the `with` block? For attention computed some other "
                "way, call attnaudit.tap(name, weights) where the weights are made."
            )
        if self._requested is not None:
            missing = [n for n in self._requested
                       if not any(n in (f, f.split(":", 1)[0]) for f in found)]
            if missing:
                raise SiteNotFound(f"requested sites never called: {missing}; sites found: {found}")

    def layout(self, site: Site, shape: tuple[int, ...], key_dim: int,
               names: Callable[[], Mapping[str, Any]] | None, *, from_call: bool = False,
               query_last: bool = False) -> Layout:
        """How a call at ``site`` with a tensor of ``shape`` (keys on ``key_dim``) maps onto
        ``(batch, heads, queries, keys)``; ``names`` are the calling frame's locals. Resolved
        once per model, site, shape and stated head count, and kept with the model (weakly),
        so the many captures of an intervention run do not resolve it again."""
        local_key = (site.name, shape, key_dim)
        layout = self._layouts.get(local_key)
        if layout is not None:
            return layout
        stated = self.heads.get(site.name, self.heads.get(site_base(site.name)))
        known = _LAYOUTS.setdefault(self.model, {})
        key = (site.name, shape, key_dim, stated)
        layout = known.get(key)
        if layout is not None:
            self._layouts[local_key] = layout
            return layout
        call_site = CallSite(
            heads=stated, names=None if names is None else int_locals(names()),
            owner_heads=self._module_heads(site.module), from_call=from_call,
            query_last=query_last,
        )
        try:
            layout = known[key] = self._layouts[local_key] = resolve_layout(shape, key_dim,
                                                                            call_site)
        except ValueError as exc:
            raise CaptureError(f"site {site.name!r}: {exc}") from None
        return layout

    def _module_heads(self, path: str) -> int | None:
        if path not in self._owner_heads:
            module = self.sites_registry.modules.get(path)
            self._owner_heads[path] = None if module is None else module_heads(module)
        return self._owner_heads[path]

    def record(self, site: Site, layout: Layout, weights: torch.Tensor,
               mask_source: Callable[[], torch.Tensor | None] | None,
               scores: torch.Tensor | None, values: Callable[[], torch.Tensor] | None,
               sink: torch.Tensor | None = None, trailing: int = 0) -> torch.Tensor | None:
        """Store one call's weights ``(B, H, Q, K)`` (mapped from the call by ``layout``) and
        the weight its rows put on sink columns ``(B, H, Q, 1)``, if any; return the edit's
        replacement, in the record layout, if any. While prompt views are active
        (:mod:`attnaudit.capturing.views`), a self-attention call on one stream of positions
        is stored as its views instead. ``trailing``: the call's query rows after these,
        when ``weights`` is one query block of it (:mod:`attnaudit.capturing.blocks`)."""
        self._reads = []
        views = None if site.kind == "cross" or not position_stream(layout) \
            else active_views(ACTIVE.views, tuple(weights.shape), trailing)
        if views is not None:
            return self._record_views(views, site, layout, weights, mask_source, sink,
                                      trailing, values)
        return self._store(site, layout, weights, mask_source, scores, values, sink)

    def _record_views(self, views: list[View], site: Site, layout: Layout,
                      weights: torch.Tensor,
                      mask_source: Callable[[], torch.Tensor | None] | None,
                      sink: torch.Tensor | None, trailing: int,
                      values: Callable[[], torch.Tensor] | None) -> torch.Tensor | None:
        """Store each selected view of one call; return the call's weights with the edited
        views written back, or None when nothing was edited. Where the adapter holds the
        call's ``values``, a value edit applies to each view (:meth:`value_read`); the
        views' values are not kept (a view's weights are renormalised: its values read with
        them are no read of the model's)."""
        registry, current = self.sites_registry, weights
        shared_mask = _once(mask_source)
        base = (run_name(ACTIVE.views, site_base(site.name), tuple(weights.shape), trailing)
                if views else "")
        for view in views:
            name = f"{base}:{view.kind}"
            view_site = replace(site, name=name, kind=view.kind, role=view.role)
            registry.found.setdefault(name, view_site)
            if not self._select(name):
                continue
            edited = self._store(view_site, layout, view.of(current),
                                 view_mask_source(view, shared_mask), None, values,
                                 view.sink(sink, current), view.share(current), view)
            if edited is not None:
                current = view.write(current, edited)
        return None if current is weights else current

    def _store(self, site: Site, layout: Layout, weights: torch.Tensor,
               mask_source: Callable[[], torch.Tensor | None] | None,
               scores: torch.Tensor | None, values: Callable[[], torch.Tensor] | None,
               sink: torch.Tensor | None = None, share: torch.Tensor | None = None,
               view: View | None = None) -> torch.Tensor | None:
        """Store one call (or ``view`` of one) at ``site``; the edit's replacement or None.
        ``values``: the call's, where the adapter holds them (kept with ``values=True``
        unless this is a view; a value edit applies)."""
        if self.edit is not None and weights.is_meta:
            raise EditError(
                f"site {site.name!r}: the weights are on the meta device, which holds shapes "
                "but no data, so an edit can be neither checked nor applied; load the model's "
                "weights (model.to_empty(device=...) then load_state_dict) before editing")
        known = self.recorded.get(site.name)
        if known is None:
            known = self.recorded[site.name] = replace(site, layout=layout.pattern,
                                                       layout_source=layout.source)
        call = AttentionCall(
            weights=weights.detach(),
            mask_source=mask_source,
            scores=scores.detach() if self.keep_scores and scores is not None else None,
            values=values().detach() if self.keep_values and values is not None
            and view is None else None,
            sink=None if sink is None else sink.detach(),
            share=None if share is None else share.detach(),
        )
        index, offset = self._append(known, call)
        if values is not None:
            self._value_sites[site.name] = None
        if self.edit is None and self.on_call is None and self.value_edit is None:
            return None
        here = replace(known, call=index, query_offset=offset)
        if values is not None and self.value_edit is not None:
            self._reads.append((here, view))
        was_busy, self.busy = self.busy, True  # their own softmaxes are not attention calls
        try:
            if self.on_call is not None:
                self.on_call(here, call)
            new = None if self.edit is None else self.edit(here, weights, call.key_mask)
        finally:
            self.busy = was_busy
        return _checked_edit(site, weights, new, self.allow_invalid)

    def value_read(self, weights: torch.Tensor, values: torch.Tensor) -> torch.Tensor | None:
        """The value edit's read ``(B, H, Q, d_v)`` of the call :meth:`record` just stored
        (None without a value edit, or where the call's values were not handed over), on the
        values' device and in their dtype. A call stored as prompt views hands the edit each
        view — its weights (as :meth:`View.of` makes them from ``weights``) and values
        (:meth:`View.values`) — and the call's rows read what they read plus, per edited
        view, the view's share of the row times the change the edit made to the view's
        read: ``share * (read' - view weights @ view values)``, exact since a view's raw
        block is its weights times its share."""
        reads, self._reads = self._reads, []
        if self.value_edit is None or not reads:
            return None
        if reads[0][1] is None:
            return self._edited_read(reads[0][0], weights, values)
        total = None
        for site, view in reads:
            assert view is not None
            own_weights, own_values = view.of(weights), view.values(values)
            read = self._edited_read(site, own_weights, own_values)
            if read is None:
                continue
            total = torch.matmul(weights, values) if total is None else total
            change = (read - torch.matmul(own_weights, own_values)) \
                * view.share(weights).to(read.dtype)
            total[:, :, view.rows:] += change
        return total

    def _edited_read(self, site: Site, weights: torch.Tensor, values: torch.Tensor
                     ) -> torch.Tensor | None:
        """The value edit's read at ``site`` of ``weights`` (B, H, Q, K) and ``values``
        (B, H, K, d_v), checked, on the values' device and in their dtype; or None."""
        assert self.value_edit is not None
        was_busy, self.busy = self.busy, True
        try:
            read = self.value_edit(site, weights, values)
        finally:
            self.busy = was_busy
        if read is None:
            return None
        expected = (*weights.shape[:-1], values.shape[-1])
        if not isinstance(read, torch.Tensor) or tuple(read.shape) != expected \
                or not read.is_floating_point():
            got = tuple(read.shape) if isinstance(read, torch.Tensor) else type(read).__name__
            raise EditError(f"value edit at site {site.name!r} returned {got}; the model needs "
                            f"a floating read of shape {expected} (batch, heads, queries, d_v)")
        return read.to(dtype=values.dtype, device=values.device)

    def _append(self, site: Site, call: AttentionCall) -> tuple[int, int]:
        """Count (and with ``keep``, store) a call at ``site``: its index and where its
        queries start on the site's stacked query axis."""
        if self.keep:
            rec = self.records.get(site.name)
            if rec is None:
                rec = self.records[site.name] = AttentionRecord(site)
            return rec.append(call)
        calls, queries = self._counts.get(site.name, (0, 0))
        self._counts[site.name] = (calls + 1, queries + call.weights.shape[2])
        return calls, queries

    def first_needed_row(self, site: Site, queries: int, keys: int) -> int:
        """The first of a call's ``queries`` query rows (over ``keys`` keys) whose weights
        are recorded: rows before it are prompt rows no prompt view shows, which the
        adapter may compute with the model's own kernel."""
        views = None if site.kind == "cross" else active_views(ACTIVE.views,
                                                               (0, 0, queries, keys))
        if views is None:
            return 0
        return views[0].rows if views else queries

    def on_tap(self, name: str, weights: torch.Tensor, key_mask: torch.Tensor | None,
               kind: Kind | None, names: Callable[[], Mapping[str, Any]]) -> torch.Tensor:
        if not isinstance(name, str) or not isinstance(weights, torch.Tensor):
            raise TypeError("attnaudit.tap(name, weights, key_mask=None, kind=None) takes a "
                            f"site name (str) and a weights tensor; got {type(name).__name__} "
                            f"and {type(weights).__name__}")
        if kind not in (None, "self", "cross"):
            raise CaptureOptionError(f"tap {name!r}: kind must be 'self', 'cross' or None, got "
                                     f"{kind!r}")
        site = self.sites_registry.for_tap(name, kind)
        if site is None:
            return weights
        layout = self.layout(site, tuple(weights.shape), -1, names)
        try:
            mask4 = None if key_mask is None else layout.to_record(key_mask.bool())
        except ValueError as exc:
            raise CaptureOptionError(f"tap {name!r}: {exc}") from None
        edited = self.record(site, layout, layout.to_record(weights),
                             None if mask4 is None else (lambda: mask4), None, None)
        return weights if edited is None else layout.from_record(edited)


def _checked_edit(site: Site, weights: torch.Tensor, new: Any,
                  allow_invalid: bool) -> torch.Tensor | None:
    """The edit's result on the weights' device and in their dtype, or EditError.

    Floating weights only (a bool mask or integer tensor is no distribution); unless
    ``allow_invalid``, no NaN, inf or negative weight where the model's own was valid.
    """
    if new is None or new is weights:
        return None
    if not isinstance(new, torch.Tensor):
        raise EditError(f"edit at site {site.name!r} returned {type(new).__name__}, not a tensor")
    if new.shape != weights.shape:
        raise EditError(
            f"edit at site {site.name!r} returned shape {tuple(new.shape)}; the model needs "
            f"{tuple(weights.shape)} (batch, heads, queries, keys)"
        )
    if new.is_meta and not weights.is_meta:
        raise EditError(f"edit at site {site.name!r} returned a tensor on the meta device (a "
                        "shape without data); return real weights, e.g. on weights.device")
    if not new.is_floating_point():
        raise EditError(
            f"edit at site {site.name!r} returned {new.dtype} weights; return floating "
            "weights (for a mask m: m.to(weights.dtype) / m.sum(-1, keepdim=True))"
        )
    new = new.to(dtype=weights.dtype, device=weights.device)
    if not allow_invalid:
        invalid = ((~torch.isfinite(new) & torch.isfinite(weights))
                   | ((new < 0) & (weights >= 0))).any()
        if bool(invalid):
            raise EditError(
                f"edit at site {site.name!r} returned NaN, inf or negative weights where the "
                "model's were valid; pass capture(..., allow_invalid=True) to use them anyway"
            )
    return new


def _traced_hint(modules: list[tuple[str, nn.Module]]) -> str:
    """Name the TorchScript submodules (``torch.jit.trace`` / ``script``) among ``modules``:
    their graphs run without calling Python attention code, which is why nothing was seen."""
    traced: list[str] = []
    for name, module in modules:  # pre-order: a traced module comes before its children
        if (name and isinstance(module, torch.jit.ScriptModule)
                and not any(name.startswith(f"{outer}.") for outer in traced)):
            traced.append(name)
    if not traced:
        return ""
    shown = ", ".join(traced[:5]) + (f" and {len(traced) - 5} more" if len(traced) > 5 else "")
    return (f"{len(traced)} submodule(s) are TorchScript (torch.jit.trace / script): {shown}; "
            "their graphs never call Python attention, so capture cannot see inside them: "
            "capture a model built from the original nn.Modules. ")


def _view_aware(select: Callable[[str], bool]) -> Callable[[str], bool]:
    """``select``, also taking a self-attention site one of whose prompt views it takes
    while prompt views are active."""

    def selected(name: str) -> bool:
        if select(name):
            return True
        return ACTIVE.views is not None and any(
            select(f"{site_base(name)}:{kind}") for kind in VIEW_KINDS)

    return selected


def _once(source: Callable[[], torch.Tensor | None] | None
          ) -> Callable[[], torch.Tensor | None] | None:
    """``source`` computed on its first call only (two views read one call's key mask)."""
    if source is None:
        return None
    kept: list[torch.Tensor | None] = []

    def read() -> torch.Tensor | None:
        if not kept:
            kept.append(source())
        return kept[0]

    return read


def _checked_heads(heads: Mapping[str, int] | None) -> dict[str, int]:
    """Stated head counts by site name; each a positive int."""
    if heads is None:
        return {}
    if not isinstance(heads, Mapping):
        raise TypeError(f"heads must map site names to head counts, got {type(heads).__name__}")
    for name, n in heads.items():
        if type(n) is not int or n < 1:
            raise CaptureOptionError(f"heads[{name!r}] must be a positive int, got {n!r}")
    return dict(heads)


def _model_namespaces(modules: list[nn.Module]) -> list[dict[str, Any]]:
    """Globals of the Python modules defining the model's classes (outside torch), where
    attention functions may have been imported by name."""
    names = {type(m).__module__ for m in modules}
    return [vars(sys.modules[n]) for n in sorted(names)
            if n in sys.modules and not n.startswith("torch.") and n != "torch"]


def capture(model: nn.Module, sites: SiteSelection = None, edit: Edit | None = None, *,
            include: PatternsArg = None, exclude: PatternsArg = None,
            roles: Mapping[str, Kind] | None = None,
            kinds: Mapping[str, Kind] | None = None, heads: Mapping[str, int] | None = None,
            scores: bool = False, values: bool = False, allow_invalid: bool = False,
            on_call: OnCall | None = None, keep: bool = True,
            max_memory: int | str | None = None,
            value_edit: ValueEdit | None = None) -> Capture:
    """Capture (and optionally replace) attention weights of an unmodified model.

    Use as ``with attnaudit.capture(model) as cap: model(...)``; anything may run inside —
    a forward pass, ``model.generate(...)``, the user's own decoding loop — under
    ``torch.no_grad()`` or with gradients enabled.

    Args:
        model: the model; softmax/SDPA calls are attributed to its modules by call stack.
        sites: None for every site found, a list of names (a name with or without its
            ``:self``/``:cross`` suffix), or a predicate over names: which of the sites found
            are recorded.
        include: a pattern or patterns (``fnmatch``, matched against a site's module path,
            its name without suffix, or its module's class name) of softmaxes that are
            attention whatever the table of model facts or the generic rules say, e.g.
            ``include="*.blend"`` for attention in a module no rule reads as attention.
        exclude: patterns of softmaxes that are never sites (a router the rules read as
            attention), e.g. ``exclude="*head_router"``; beats ``include`` and ``roles``.
        roles: patterns to ``"self"`` / ``"cross"``: attention of that kind, whatever the
            generic rules and the cross-attention name words say, e.g.
            ``{"*.mixer": "cross"}``. The order of rules (this override, then the table of
            model facts, then the generic rules) is in
            :mod:`attnaudit.capturing.model_facts`.
        edit: ``(site, weights, key_mask) -> weights``, called at every selected call with
            weights ``(batch, heads, queries, keys)``; what it returns is what the model's
            downstream computation uses (None leaves the weights unchanged). ``site.call``
            and ``site.query_offset`` say which call it is.
        value_edit: ``(site, weights, values) -> read``, called at every selected call
            whose values capture holds (the explicit ``F.scaled_dot_product_attention``
            path, ``nn.MultiheadAttention``'s Python path; :attr:`Capture.value_sites`
            names them) after ``edit``, with the weights ``(batch, heads, queries, keys)``
            the model then uses and the values ``(batch, heads, keys, d_v)`` (grouped-query
            values repeated per query head). It returns the read
            ``(batch, heads, queries, d_v)`` that replaces ``weights @ values`` (e.g.
            ``weights @ new_values``, or that with only some query rows changed), or None to
            keep it. At a prompt view it is called per view with the view's weights and
            values (:meth:`Capture.value_read`). Where the model's own code multiplies by
            the values (the softmax path, taps) it is never called.
        kinds: override or supply kinds by exact site name without suffix, e.g.
            ``{"attend": "cross"}`` (beats ``roles``).
        heads: state the head count of sites whose code folds heads into the batch axis
            (``(batch * heads, queries, keys)``) where nothing at the call site says it, by
            site name with or without suffix, e.g. ``{"decoder.attn": 8}``. Each record's
            ``site.layout`` / ``site.layout_source`` say how its layout was determined.
        scores: also keep pre-softmax scores.
        values: also keep values ``(batch, heads, keys, d_v)`` where the mechanism exposes
            them (not at prompt views, whose weights are renormalised).
        allow_invalid: let an edit put NaN, inf or negative weights where the model's own were
            valid (refused with :class:`EditError` otherwise; bool or integer results are
            always refused).
        on_call: ``(site, call) -> None``, handed every recorded call as it happens (an
            :class:`AttentionCall` with the model's own weights, before any edit;
            ``site.call`` / ``site.query_offset`` as for ``edit``).
        keep: keep the calls in :attr:`Capture.records`; ``keep=False`` with ``on_call``
            streams them: each call is dropped once ``on_call`` returns, so memory does not
            grow with the calls (``records`` stays empty; ``recorded`` names the sites).
        max_memory: bytes (or ``"2GiB"``) one block of explicitly computed attention may
            use (default 1 GiB): a larger SDPA call is computed, recorded and edited in
            query blocks (:mod:`attnaudit.capturing.blocks`), each its own call.

    On exit every patch and hook is removed, even when the body raises. With no exception,
    exit raises :class:`NoAttentionFound` if no site was seen and :class:`SiteNotFound` if a
    requested name never appeared.
    """
    return Capture(model, sites, edit, include=include, exclude=exclude, roles=roles,
                   kinds=kinds, heads=heads, scores=scores, values=values,
                   allow_invalid=allow_invalid, on_call=on_call, keep=keep,
                   max_memory=max_memory, value_edit=value_edit)
