"""Naming attention sites and deciding which ones the user selected.

A site is found by walking up from the attention call to the nearest frame that runs a
method of one of the model's modules (whatever its first parameter is called). Its name is
that module's path, plus the method name when it is not ``forward`` (``attend`` for a
root-module method, ``decoder.attn`` for a submodule's forward), plus ``@2``, ``@3``... for
further attention calls made from other lines of the same method (in order of first call,
so names do not depend on line numbers), plus ``:self`` / ``:cross`` when the kind is known.

A free function whose first argument is one of the model's modules
(``attend(model, q, k, v)`` called from the user's own loop, Hugging Face's
``eager_attention_forward(module, ...)``) computes that module's attention: the site is the
module's own method further up the stack when there is one, else the module's path (plus
the function's name for the root module). ``torch.compile`` wrappers (``_orig_mod``) are
left out of paths, so names and overrides are the same compiled or not.

Whether a call is a site, and its kind, are decided in the order of
:mod:`attnaudit.capturing.model_facts`: the user's override (``include`` / ``exclude`` /
``roles``, ``kinds``), then the model's entries in the table of model facts, then the
generic rules (:mod:`attnaudit.capturing.roles`; for the kind: the attention module's own
``is_cross_attention`` local, ``is_causal`` on an SDPA call, then :func:`kind_from_name`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from types import CodeType, FrameType
from typing import Any

from torch import nn

from attnaudit.capturing.model_facts import ModelFacts, SiteRules
from attnaudit.capturing.roles import SINK_NAMES, routes_or_mixes
from attnaudit.errors import CaptureOptionError
from attnaudit.record import Kind, Site

SiteSelection = None | Iterable[str] | Callable[[str], bool]

MAX_FRAMES = 12
# Softmax calls made by generation utilities (sampling, logits processors) are not attention.
NOT_ATTENTION_DIRS = (os.sep + os.path.join("transformers", "generation") + os.sep,)
# A bool local of the attention method that says cross-attention (Hugging Face's LED, LongT5...).
CROSS_LOCAL = "is_cross_attention"
# Parts of cross-attention module names (model_facts.HEURISTICS says whose).
CROSS_WORDS = ("cross", "encoder_attn", "encdec", "enc_dec", "src_attn", "multihead_attn",
                "context_attn", "src_trg_att", "src_tgt_att", "enc_att", "inter_attn",
                "source_attn", "memory_attn", "ctx_attn")
_COMPILED = "_orig_mod"


def clean_path(path: str) -> str:
    """A module path without ``torch.compile`` wrapper parts."""
    if _COMPILED not in path:
        return path
    return ".".join(p for p in path.split(".") if p != _COMPILED)


def kind_from_name(path: str) -> Kind | None:
    """Guess self/cross from a module path's parts within its layer (after the last layer
    index): ``decoder.layers.0.encoder_attn`` and ``decoder.layer.0.crossattention.self``
    are cross, ``encoder.layer.0.attention.self`` is self."""
    parts = path.lower().split(".")
    digits = [i for i, p in enumerate(parts) if p.isdigit()]
    within = parts[digits[-1] + 1:] if digits and digits[-1] < len(parts) - 1 else parts[-1:]
    if any(word in part for part in within for word in CROSS_WORDS):
        return "cross"
    if "self" in within[-1]:
        return "self"
    return None


def site_base(name: str) -> str:
    """A site name without its ``:self`` / ``:cross`` suffix."""
    return name.split(":", 1)[0]


def _is_method(code: CodeType) -> bool:
    """True for a function defined in a class body (not a free or nested function)."""
    parent, dot, _ = code.co_qualname.rpartition(".")
    return bool(dot) and not parent.endswith("<locals>")


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
    wanted = list(sites) if isinstance(sites, Iterable) else None
    if wanted is None or not all(isinstance(n, str) for n in wanted):
        raise TypeError("sites must be None, a site name, a list of site names or a predicate "
                        f"over names; got {sites!r}")
    wanted_set = set(wanted)
    return (lambda name: name in wanted_set or site_base(name) in wanted_set), wanted


def _checked_kinds(kinds: Mapping[str, Kind] | None) -> dict[str, Kind]:
    if kinds is None:
        return {}
    if not isinstance(kinds, Mapping):
        raise TypeError(f"kinds must map site names to 'self' or 'cross', got {kinds!r}")
    bad = {name: kind for name, kind in kinds.items() if kind not in ("self", "cross")}
    if bad:
        raise CaptureOptionError(f"kinds must be 'self' or 'cross'; got {bad}")
    return {clean_path(name): kind for name, kind in kinds.items()}


class SiteRegistry:
    """Resolves calls to :class:`Site` objects once per location and remembers what was found."""

    def __init__(self, named_modules: list[tuple[str, nn.Module]], select: Callable[[str], bool],
                 kinds: Mapping[str, Kind] | None = None, override: SiteRules | None = None,
                 facts: list[ModelFacts] | None = None) -> None:
        self.paths = {id(m): clean_path(path) for path, m in named_modules}
        self.modules = {clean_path(path): m for path, m in named_modules}
        self.select = select
        self.kinds = _checked_kinds(kinds)
        # the user's rules first, then each table entry's, before the generic rules
        self.rules = [r for r in (override, *(f.sites for f in facts or ())) if r]
        extra = [n for f in facts or () for n in f.sink_names]
        self.sink_names = tuple(dict.fromkeys((*SINK_NAMES, *extra)))
        self.found: dict[str, Site] = {}
        self._by_key: dict[object, Site | None] = {}
        self._base_lines: dict[str, list[object]] = {}

    def from_frame(self, frame: FrameType | None, mechanism: str,
                   kind_hint: Kind | None = None) -> Site | None:
        """The selected site whose code called attention from ``frame``, or None (also for a
        softmax that routes or mixes rather than attends: :mod:`attnaudit.capturing.roles`)."""
        caller = frame.f_code.co_name if frame is not None else ""
        candidate: tuple[FrameType, str] | None = None
        for _ in range(MAX_FRAMES):
            if frame is None:
                break
            code = frame.f_code
            if any(d in code.co_filename for d in NOT_ATTENTION_DIRS):
                return None
            if code.co_argcount:
                owner = frame.f_locals.get(code.co_varnames[0])
                path = self.paths.get(id(owner))
                if path is not None:
                    if _is_method(code):
                        if candidate is not None and candidate[1] != path:
                            break  # a free function's module is not this method's
                        return self._site_in_method(frame, path, mechanism, kind_hint, True,
                                                    caller)
                    candidate = candidate or (frame, path)
            frame = frame.f_back
        if candidate is None:
            return None
        return self._site_in_method(*candidate, mechanism, kind_hint, False, caller)

    def _site_in_method(self, frame: FrameType, path: str, mechanism: str,
                        kind_hint: Kind | None, method: bool, caller: str) -> Site | None:
        code = frame.f_code
        key = (code, frame.f_lineno, path, caller)
        if key in self._by_key:
            return self._by_key[key]
        module = self.modules.get(path)
        func = code.co_name
        own_name = func == "forward" or (not method and path)
        base = path if own_name else ".".join(p for p in (path, func) if p)
        plain = base or "forward"
        lines = self._base_lines.setdefault(plain, [])
        line = (code, frame.f_lineno)
        at = lines.index(line) if line in lines else len(lines)
        # a second attention call line in the same method: numbered by first call
        base = f"{plain}@{at + 1}" if at else plain
        names = self._names(path, base, module)
        said = self._said(names)
        attention = not routes_or_mixes(module, path, caller) if said is None else said
        if not attention:
            self._by_key[key] = None  # no number taken: later attention lines keep theirs
            return None
        if line not in lines:
            lines.append(line)
        local_cross = frame.f_locals.get(CROSS_LOCAL)
        local_kind = ("cross" if local_cross else "self") if isinstance(local_cross, bool) else None
        kind = (self.kinds.get(base) or self._kind(names) or local_kind or kind_hint
                or kind_from_name(path))
        return self._register(key, base, kind, mechanism, path)

    @staticmethod
    def _names(path: str, name: str, module: nn.Module | None) -> tuple[str, ...]:
        """What a pattern is matched against: the module's path, the site's name without
        its kind, the module's class name."""
        return (path, name) if module is None else (path, name, type(module).__name__)

    def _said(self, names: tuple[str, ...]) -> bool | None:
        """Whether the user's or the model's entries' rules make a site named ``names``
        attention (True) or not (False); None when none of them says."""
        for rules in self.rules:
            said = rules.is_attention(names)
            if said is not None:
                return said
        return None

    def _kind(self, names: tuple[str, ...]) -> Kind | None:
        return next((kind for rules in self.rules if (kind := rules.kind(names))), None)

    def names_at(self, frame: FrameType, site: Site) -> dict[str, Any]:
        """The locals of the frames from the attention call up to the site's own method (a
        softmax wrapper, a helper method, then the module's ``forward``), inner names first:
        what the call site knows about its layout."""
        owner = self.modules.get(site.module)
        names: dict[str, Any] = {}
        at: FrameType | None = frame
        for _ in range(MAX_FRAMES):
            if at is None:
                break
            f_locals = at.f_locals
            names = {**f_locals, **names}
            code = at.f_code
            if owner is not None and code.co_argcount and \
                    f_locals.get(code.co_varnames[0]) is owner:
                break
            at = at.f_back
        return names

    def for_module(self, module: nn.Module, kind: Callable[[], Kind | None],
                   mechanism: str) -> Site | None:
        """The selected site for a whole attention module (``nn.MultiheadAttention``);
        ``kind()`` is asked on the module's first call only."""
        key = id(module)
        if key in self._by_key:
            return self._by_key[key]
        path = self.paths[key]
        names = self._names(path, path or "forward", module)
        if self._said(names) is False:
            self._by_key[key] = None
            return None
        return self._register(key, path or "forward",
                              self.kinds.get(path) or self._kind(names) or kind(), mechanism,
                              path)

    def for_tap(self, name: str, kind: Kind | None) -> Site | None:
        """The selected site for an explicit :func:`attnaudit.tap` (named by the user)."""
        key = ("tap", name)
        if key in self._by_key:
            return self._by_key[key]
        if self._said((name,)) is False:
            self._by_key[key] = None
            return None
        site = Site(name=name, kind=kind or self._kind((name,)), mechanism="tap", module="")
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
