"""One teacher-forced pass, traced for contribution measures.

:func:`trace` runs the target's model once on ``(batch, emitted)`` under
:func:`~attnaudit.capturing.capture` with ``values=True`` and forward hooks, and keeps, per
attention site: the weights, the values (where the mechanism exposes them), the attention
module's query-side input and output, and the layer norms its layer called before and after
it. Which norm belongs to a site is read off the tensors (the norm whose output is the
attention's input, or whose input is its output: :func:`attnaudit.contributions.alti.block_of`);
which modules are norms, by :func:`is_norm`.

The pass: an encoder-decoder target's own ``teacher_forced``; a decoder-only target's
:attr:`~attnaudit.targets.contract.DecoderOnlyTarget.raw_pass`, the same pass *without*
prompt views, so that the records are the raw self-attention (role ``self``) over every
earlier position (the keys of a continuation step are the prompt tokens and the generated
prefix, in that order, as the target's ``sequence`` gives them). Which of the two a target
is, and each site's role, are read from the target's family and the records
(:class:`~attnaudit.record.Role`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from weakref import WeakKeyDictionary

import torch
from torch import nn

from attnaudit.capturing import capture
from attnaudit.errors import ContributionError
from attnaudit.record import AttentionRecord, Family, Role
from attnaudit.targets.contract import Batch, DecoderOnlyTarget, Seq2SeqTarget

# Site -> attention module path, found once per model by a one-example pass.
_SITE_MODULES: WeakKeyDictionary[nn.Module, dict[str, str]] = WeakKeyDictionary()


@dataclass
class Call:
    """One module call: its first input and its output (first element), and when it ran."""

    order: int
    module: nn.Module
    inputs: torch.Tensor | None
    output: torch.Tensor | None
    times: int = 1


@dataclass
class SiteTrace:
    """What one attention site did in the traced pass.

    role: :class:`~attnaudit.record.Role`: ``encoder_self``, ``decoder_self``, ``cross``
    (encoder-decoder) or ``self`` (a decoder-only model's raw self-attention). layer: the
    path of the module holding the site's layer (the first indexed module above it).
    weights: (B, H, Q, K) float32.
    values: (B, H, K, d_v) float32 or None (``value_reason`` says why); ``values_from``:
    ``capture``, or the value projection's path where they were found by role. call: the attention
    module's query-side input (B, Q, d) and output; calls: how often the site attended in the
    pass. linears: the calls of every linear-like
    module in the site's layer, by path (role detection of the output projection, which may
    sit beside the attention module, as BERT's ``attention.output.dense``). norms: the
    layer's norm calls, by path.
    """

    name: str
    role: Role
    layer: str
    module: nn.Module
    module_path: str
    weights: torch.Tensor
    values: torch.Tensor | None
    value_reason: str
    call: Call | None
    linears: dict[str, Call] = field(default_factory=dict)
    norms: dict[str, Call] = field(default_factory=dict)
    values_from: str = "capture"
    calls: int = 1

    @property
    def heads(self) -> int:
        return int(self.weights.shape[1])

    @property
    def module_dtype(self) -> torch.dtype | None:
        """The dtype the attention module computes in (its first parameter's)."""
        param = next(self.module.parameters(), None)
        return None if param is None else param.dtype


@dataclass
class Trace:
    """A traced pass: every site, in order of first call, and the token ids on each axis.

    causal: the target is of the decoder-only family (keys: prompt + prefix). prompt: P,
    its prompt positions (0 for encoder-decoder). query_mask: per role, bool (B, Q) of rows
    that are real tokens. key_ids: per role, (B, K) long ids of the keys (the decoder start token,
    unknown to the contract, is -1). layer_outputs: each layer module's output (B, Q, d).
    """

    target: Seq2SeqTarget
    batch: Batch
    emitted: torch.Tensor
    sites: dict[str, SiteTrace]
    causal: bool
    prompt: int
    query_mask: dict[str, torch.Tensor]
    key_ids: dict[str, torch.Tensor]
    layer_outputs: dict[str, torch.Tensor]

    @property
    def reading_role(self) -> Role:
        """The role of the sites whose step rows read the source: ``self`` (the raw
        decoder-only pass: prompt then prefix keys) or ``cross``."""
        return Role.SELF if self.causal else Role.CROSS


def is_decoder_only(target: Seq2SeqTarget) -> bool:
    """The target is of the decoder-only family (its own declaration)."""
    return target.family is Family.DECODER_ONLY


def _raw_runs(target: Seq2SeqTarget) -> tuple[Callable[[Batch, torch.Tensor], Any],
                                               Callable[[Batch, torch.Tensor], Any]]:
    """A decoder-only target's ``sequence`` and ``raw_pass``; a ContributionError naming
    what it lacks otherwise."""
    sequence = target.sequence if isinstance(target, DecoderOnlyTarget) else None
    raw_pass = target.raw_pass if isinstance(target, DecoderOnlyTarget) else None
    if sequence is None or raw_pass is None:
        raise ContributionError(
            f"{target.name}: a decoder-only target needs `sequence` and `raw_pass` (its one "
            "pass's inputs, and that pass run without prompt views) for contribution measures")
    return sequence, raw_pass


def run_pass(target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor) -> Any:
    """The traced forward: ``teacher_forced``, or the raw decoder-only pass (module
    docstring)."""
    if is_decoder_only(target):
        return _raw_runs(target)[1](batch, emitted)
    return target.teacher_forced(batch, emitted)


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, tuple | list) and value and isinstance(value[0], torch.Tensor):
        return value[0]
    return None


# torch's own (nn.RMSNorm is new in torch 2.4)
NORM_CLASSES = tuple(c for c in (nn.LayerNorm, getattr(nn, "RMSNorm", None)) if c is not None)


def is_norm(module: nn.Module) -> bool:
    """A normalisation layer: torch's own (:data:`NORM_CLASSES`), or a class whose name says
    ``Norm`` with a weight or none: the model-specific variants (``LlamaRMSNorm``,
    ``T5LayerNorm``...) that transformers writes without subclassing torch's."""
    if isinstance(module, NORM_CLASSES):
        return True
    return "Norm" in type(module).__name__ and isinstance(getattr(module, "weight", None),
                                                          torch.Tensor | type(None))


def is_linear_like(module: nn.Module) -> bool:
    """A module with a 2-D weight matrix (``nn.Linear``, GPT-2's ``Conv1D``...)."""
    weight = getattr(module, "weight", None)
    return isinstance(weight, torch.Tensor) and weight.ndim == 2 and not isinstance(
        module, nn.Embedding)


def _under(path: str, ancestor: str) -> bool:
    """``path`` is strictly inside the module at ``ancestor`` (``""``: the root)."""
    return path != ancestor and (not ancestor or path.startswith(f"{ancestor}."))


def layer_path(path: str) -> str:
    """The path of the first indexed module above ``path``: ``model.encoder.layers.0`` for
    ``model.encoder.layers.0.self_attn``, ``encoder.block.0`` for T5's
    ``encoder.block.0.layer.0.SelfAttention``; the parent when nothing is indexed."""
    parts = path.split(".")
    for at, part in enumerate(parts[:-1]):
        if part.isdigit():
            return ".".join(parts[: at + 1])
    return ".".join(parts[:-1])


def _site_modules(target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor,
                  sites: Any) -> dict[str, str]:
    """Site name -> attention module path, from a one-example pass (kept per model)."""
    known = _SITE_MODULES.setdefault(target.model, {})
    if not known:
        one = batch.select([0])
        with torch.no_grad(), capture(target.model, sites, kinds=target.kinds) as cap:
            run_pass(target, one, emitted[:1])
        known.update({name: rec.site.module for name, rec in cap.records.items()})
    return known


class _Hooks:
    """Forward hooks recording module calls in order; removed by :meth:`close`."""

    def __init__(self) -> None:
        self.calls: dict[str, Call] = {}
        self.order = 0
        self._handles: list[Any] = []

    def _note(self, path: str, module: nn.Module, inputs: torch.Tensor | None,
              output: torch.Tensor | None) -> None:
        seen = self.calls.get(path)
        if seen is not None:
            seen.times += 1
            return
        self.order += 1
        self.calls[path] = Call(self.order, module, inputs, output)

    def watch(self, path: str, module: nn.Module, attention: bool = False) -> None:
        if attention:  # order at entry: the norms called before it come first
            def pre(mod: nn.Module, args: tuple, kwargs: dict) -> None:
                hidden = kwargs.get("hidden_states", args[0] if args else None)
                self._note(path, mod, _first_tensor(hidden), None)

            def post(mod: nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
                call = self.calls[path]
                if call.times == 1:
                    call.output = _first_tensor(out)

            self._handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
            self._handles.append(module.register_forward_hook(post, with_kwargs=True))
            return

        def hook(mod: nn.Module, args: tuple, out: Any) -> None:
            self._note(path, mod, _first_tensor(args), _first_tensor(out))

        self._handles.append(module.register_forward_hook(hook))

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def _role(target: Seq2SeqTarget, causal: bool, record: AttentionRecord) -> Role:
    """The record's role: ``self`` in a decoder-only raw pass, the role capture gave it,
    ``cross`` by its kind, else self-attention inside the model's encoder or not."""
    if causal:
        return Role.SELF
    if record.site.role is not None:
        return record.site.role
    if record.kind == "cross":
        return Role.CROSS
    path = record.site.module
    encoder_path = ""
    get_encoder = getattr(target.model, "get_encoder", None)
    if callable(get_encoder):
        encoder = get_encoder()
        encoder_path = next((p for p, m in target.model.named_modules() if m is encoder), "")
    inside = encoder_path and (path == encoder_path or path.startswith(encoder_path + "."))
    return Role.ENCODER_SELF if inside else Role.DECODER_SELF


def trace(target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor, *,
          sites: Any = None) -> Trace:
    """Run one traced pass (module docstring) under ``torch.no_grad()``.

    Args:
        target, batch: the model and one batch of sources.
        emitted: (B, T) long, the decoded output the pass teacher-forces.
        sites: capture site selection (default: the target's).
    """
    model, sites = target.model, target.sites if sites is None else sites
    causal = is_decoder_only(target)
    paths = _site_modules(target, batch, emitted, sites)
    modules = dict(model.named_modules())
    hooks = _Hooks()
    layers = {layer_path(p) for p in paths.values()}
    try:
        for path in set(paths.values()):
            hooks.watch(path, modules[path], attention=True)
        for path, module in modules.items():  # where an output projection may be
            if is_linear_like(module) and any(_under(path, layer) for layer in layers):
                hooks.watch(path, module)
        for path, module in modules.items():
            if is_norm(module) and any(_under(path, layer) for layer in layers):
                hooks.watch(path, module)
        for layer in layers - set(paths.values()):  # an attention module is watched already
            if layer in modules:
                hooks.watch(layer, modules[layer])
        with torch.no_grad(), capture(model, sites, kinds=target.kinds,
                                      values=True) as cap:
            run_pass(target, batch, emitted)
    finally:
        hooks.close()
    out: dict[str, SiteTrace] = {}
    for name, record in cap.records.items():
        path = record.site.module
        layer = layer_path(path)
        values, reason = record.values, ""
        if values is None:
            reason = (f"the {record.site.mechanism} path does not expose values (capture keeps "
                      f"them for F.scaled_dot_product_attention and nn.MultiheadAttention "
                      f"calls): {_values_hint(model)}")
        elif len(record.calls) != 1:
            values, reason = None, (f"called {len(record.calls)} times in one pass (one "
                                    "call per site is decomposed)")
        out[name] = SiteTrace(
            name=name, role=_role(target, causal, record), layer=layer,
            module=modules[path], module_path=path, weights=record.weights.float(),
            values=None if values is None else values.float(), value_reason=reason,
            call=hooks.calls.get(path),
            linears={p: c for p, c in hooks.calls.items()
                     if _under(p, layer) and is_linear_like(modules[p])},
            norms={p: c for p, c in hooks.calls.items()  # not the query/key norms inside
                   if _under(p, layer) and not _under(p, path) and is_norm(modules[p])},
            calls=len(record.calls))
    return Trace(target, batch, emitted, out, causal,
                 int(batch.source_ids.shape[1]) if causal else 0,
                 *_axes(target, batch, emitted, causal),
                 {p: c.output for p, c in hooks.calls.items() if p in layers
                  and c.output is not None})


def _values_hint(model: nn.Module) -> str:
    """What makes a model's values visible to capture."""
    backend = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if isinstance(backend, str):  # a Hugging Face model
        return "load the model with attn_implementation='sdpa'"
    return "compute the attention with F.scaled_dot_product_attention"


def _axes(target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor, causal: bool
          ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Query masks and key ids per role (see :class:`Trace`)."""
    steps = target.step_mask(emitted)
    source = batch.source_mask.bool()
    if causal:
        ids = _raw_runs(target)[0](batch, emitted)
        return ({Role.SELF: ids["attention_mask"].bool()}, {Role.SELF: ids["input_ids"]})
    start = torch.full_like(emitted[:, :1], -1)
    decoder_keys = torch.cat([start, emitted[:, :-1]], dim=1)
    return ({Role.ENCODER_SELF: source, Role.CROSS: steps, Role.DECODER_SELF: steps},
            {Role.ENCODER_SELF: batch.source_ids, Role.CROSS: batch.source_ids,
             Role.DECODER_SELF: decoder_keys})

