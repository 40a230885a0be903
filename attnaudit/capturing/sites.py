"""Naming attention sites and deciding which ones the user selected.

A site is found by walking up from the attention call to the nearest frame that runs a
method of one of the model's modules. Its name is that module's path, plus the method
name when it is not ``forward`` (``attend`` for a root-module method, ``decoder.attn`` for a
submodule's forward), plus ``:self`` / ``:cross`` when the kind is known.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from types import FrameType

from torch import nn

from attnaudit.record import Kind, Site

SiteSelection = None | Iterable[str] | Callable[[str], bool]

MAX_FRAMES = 12
# Softmax calls made by generation utilities (sampling, logits processors) are not attention.
_NOT_ATTENTION_DIRS = (os.sep + os.path.join("transformers", "generation") + os.sep,)
_CROSS_WORDS = ("cross", "encoder_attn", "encdec", "enc_dec", "src_attn", "multihead_attn")


def kind_from_name(path: str) -> Kind | None:
    """Guess self/cross from a module path's last part (``encoder_attn``, ``SelfAttention``)."""
    last = path.rsplit(".", 1)[-1].lower()
    if any(word in last for word in _CROSS_WORDS):
        return "cross"
    if "self" in last:
        return "self"
    return None


def make_selector(sites: SiteSelection) -> tuple[Callable[[str], bool], list[str] | None]:
    """A predicate over site names, and the explicitly requested names (None for all/predicate).

    A requested name matches a site's full name or its name without the ``:kind`` suffix.
    """
    if sites is None:
        return (lambda name: True), None
    if callable(sites):
        return sites, None
    if isinstance(sites, str):
        sites = [sites]
    wanted = list(sites)
    wanted_set = set(wanted)
    return (lambda name: name in wanted_set or name.split(":", 1)[0] in wanted_set), wanted


class SiteRegistry:
    """Resolves calls to :class:`Site` objects once per location and remembers what was found."""

    def __init__(self, named_modules: list[tuple[str, nn.Module]], select: Callable[[str], bool],
                 kinds: Mapping[str, Kind] | None = None) -> None:
        self.paths = {id(m): path for path, m in named_modules}
        self.select = select
        self.kinds = dict(kinds or {})
        self.found: dict[str, Site] = {}
        self._by_key: dict[object, Site | None] = {}
        self._base_owner: dict[str, object] = {}

    def from_frame(self, frame: FrameType | None, mechanism: str,
                   kind_hint: Kind | None = None) -> Site | None:
        """The selected site whose code called attention from ``frame``, or None."""
        for _ in range(MAX_FRAMES):
            if frame is None:
                return None
            code = frame.f_code
            if any(d in code.co_filename for d in _NOT_ATTENTION_DIRS):
                return None
            if code.co_argcount and code.co_varnames[0] == "self":
                owner = frame.f_locals.get("self")
                path = self.paths.get(id(owner))
                if path is not None:
                    return self._site_in_method(frame, path, mechanism, kind_hint)
            frame = frame.f_back
        return None

    def _site_in_method(self, frame: FrameType, path: str, mechanism: str,
                        kind_hint: Kind | None) -> Site | None:
        code = frame.f_code
        key = (code, frame.f_lineno, path)
        if key in self._by_key:
            return self._by_key[key]
        func = code.co_name
        base = path if func == "forward" else ".".join(p for p in (path, func) if p)
        base = base or "forward"
        owner = self._base_owner.setdefault(base, (code, frame.f_lineno))
        if owner != (code, frame.f_lineno):
            base = f"{base}@{frame.f_lineno}"
        local_cross = frame.f_locals.get("is_cross_attention")
        local_kind = ("cross" if local_cross else "self") if isinstance(local_cross, bool) else None
        kind = self.kinds.get(base) or local_kind or kind_hint or kind_from_name(path)
        return self._register(key, base, kind, mechanism, path)

    def for_module(self, module: nn.Module, kind: Kind | None, mechanism: str) -> Site | None:
        """The selected site for a whole attention module (``nn.MultiheadAttention``)."""
        path = self.paths[id(module)]
        key = (id(module), kind)
        if key in self._by_key:
            return self._by_key[key]
        return self._register(key, path or "forward", self.kinds.get(path) or kind, mechanism, path)

    def for_tap(self, name: str, kind: Kind | None) -> Site | None:
        """The selected site for an explicit :func:`attnaudit.tap` (named by the user)."""
        key = ("tap", name)
        if key in self._by_key:
            return self._by_key[key]
        site = Site(name=name, kind=kind, mechanism="tap", module="")
        return self._remember(key, site)

    def _register(self, key: object, base: str, kind: Kind | None, mechanism: str,
                  path: str) -> Site | None:
        name = f"{base}:{kind}" if kind else base
        return self._remember(key, Site(name=name, kind=kind, mechanism=mechanism, module=path))

    def _remember(self, key: object, site: Site) -> Site | None:
        self.found.setdefault(site.name, site)
        chosen = site if self.select(site.name) else None
        self._by_key[key] = chosen
        return chosen
