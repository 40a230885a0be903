"""What a target's callables return, checked where it enters the audit.

:func:`checked_target` wraps a :class:`~attnaudit.targets.contract.Seq2SeqTarget`'s callables
so that every batch, greedy output and logits tensor is checked against the contract of
:mod:`attnaudit.targets.contract` before anything reads it, and so that an exception raised
inside the target's own code becomes a :class:`~attnaudit.errors.TargetError` naming the
callable (the command line prints it as one line). Sources longer than the model's position
limit are refused with the limit and where it comes from, instead of an embedding's
``IndexError: index out of range in self`` deep inside the model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn

from attnaudit.errors import AttnauditError, TargetError
from attnaudit.targets.contract import Batch, Seq2SeqTarget

_CHECKED = "_attnaudit_checked"
_END = object()  # what next() returns when the target's batches run out


def config_position_limit(config: Any) -> int | None:
    """A config's ``max_position_embeddings`` (its text config's, for a composite config
    that keeps it there) when it is a limit: a positive integer (a missing value, ``-1``
    or 0 mean the model has none)."""
    limit = getattr(config, "max_position_embeddings", None)
    text = getattr(config, "get_text_config", None)
    if limit is None and callable(text):
        limit = getattr(text(), "max_position_embeddings", None)
    if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
        return limit
    return None


def position_limit(model: nn.Module) -> tuple[int, str] | None:
    """The most source positions ``model`` can embed and where that number comes from:
    its config's ``max_position_embeddings``, else the smallest embedding table whose
    module name says "pos"; None when neither exists (recurrent, relative positions)."""
    limit = config_position_limit(getattr(model, "config", None))
    if limit is not None:
        return limit, "config.max_position_embeddings"
    tables = [(m.num_embeddings, name) for name, m in model.named_modules()
              if isinstance(m, nn.Embedding) and "pos" in name.rsplit(".", 1)[-1].lower()]
    return min(tables) if tables else None


def checked_target(target: Seq2SeqTarget) -> Seq2SeqTarget:
    """A copy of ``target`` whose callables check what they return (see the module
    docstring); a target already checked is returned as it is."""
    if getattr(target.greedy, _CHECKED, False):
        return target
    name = target.name
    limit = position_limit(target.model)

    def batches() -> Iterator[Batch]:
        produced = call_target(name, "batches", target.batches)
        for index, batch in enumerate(_checked_iter(name, produced)):
            _check_batch(name, index, batch, limit)
            yield batch

    def greedy(batch: Batch) -> torch.Tensor:
        emitted = call_target(name, "greedy", target.greedy, batch)
        _check_ids(name, emitted, len(batch))
        return emitted

    def teacher_forced(batch: Batch, emitted: torch.Tensor) -> torch.Tensor:
        return _check_logits(name, "teacher_forced",
                             call_target(name, "teacher_forced", target.teacher_forced, batch,
                                   emitted), tuple(emitted.shape))

    changes: dict[str, Any] = {"batches": batches, "greedy": _mark(greedy),
                               "teacher_forced": teacher_forced}
    if target.encode is not None:
        encode = target.encode
        changes["encode"] = lambda batch: call_target(name, "encode", encode, batch)
    if target.decode is not None:
        decode = target.decode
        changes["decode"] = lambda batch, encoded, emitted: _check_logits(
            name, "decode", call_target(name, "decode", decode, batch, encoded, emitted),
            tuple(emitted.shape))
    if target.decode_states is not None:
        states = target.decode_states
        changes["decode_states"] = lambda batch, encoded, emitted: call_target(
            name, "decode_states", states, batch, encoded, emitted)
    for what in ("decode_step", "decode_steps"):  # logits (B, V) at a step, or per row
        if getattr(target, what) is not None:
            changes[what] = _checked_step(name, what, getattr(target, what))
    if target.cached_decode is not None:
        cached = target.cached_decode
        changes["cached_decode"] = lambda batch, emitted: _check_logits(
            name, "cached_decode", call_target(name, "cached_decode", cached, batch, emitted),
            tuple(emitted.shape), fewer_steps=True)
    return target.with_options(**changes)


def _checked_step(name: str, what: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (``decode_step`` or ``decode_steps``) with its errors named and its logits
    checked: one row (V,) per sequence of the batch."""
    def step(batch: Batch, encoded: Any, states: Any, emitted: torch.Tensor, at: Any) -> Any:
        return _check_logits(name, what, call_target(name, what, fn, batch, encoded, states,
                                                     emitted, at), (len(batch),))
    return step


def _mark(fn: Callable[..., Any]) -> Callable[..., Any]:
    setattr(fn, _CHECKED, True)
    return fn


def call_target(name: str, what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``; an exception from the target's own code becomes a TargetError."""
    try:
        return fn(*args)
    except AttnauditError:
        raise
    except Exception as exc:
        hint = ""
        if isinstance(exc, IndexError) and "out of range" in str(exc):
            hint = (" (an embedding was given an index outside its table: a token id outside "
                    "the vocabulary, or more positions than the model has)")
        raise TargetError(f"target {name!r}: {what} failed: {type(exc).__name__}: "
                          f"{exc}{hint}") from exc


def _checked_iter(name: str, produced: Iterable[Any]) -> Iterator[Any]:
    iterator = call_target(name, "batches", iter, produced)
    while True:
        item = call_target(name, "batches", next, iterator, _END)
        if item is _END:
            return
        yield item


def _check_batch(name: str, index: int, batch: Any, limit: tuple[int, str] | None) -> None:
    where = f"target {name!r}: batch {index}"
    if not isinstance(batch, Batch):
        raise TargetError(f"{where}: batches must yield attnaudit.Batch objects, got "
                          f"{type(batch).__name__}")
    ids, mask = batch.source_ids, batch.source_mask
    if (not isinstance(ids, torch.Tensor) or ids.ndim != 2 or ids.is_floating_point()
            or ids.dtype == torch.bool):
        got = f"{ids.dtype} {tuple(ids.shape)}" if isinstance(ids, torch.Tensor) else type(ids)
        raise TargetError(f"{where}: source_ids must be integer ids (batch, positions), "
                          f"got {got}")
    if not isinstance(mask, torch.Tensor) or mask.shape != ids.shape:
        seen = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise TargetError(f"{where}: source_mask must match source_ids {tuple(ids.shape)}, "
                          f"got {seen}")
    if len(batch.texts) != ids.shape[0]:
        raise TargetError(f"{where}: {len(batch.texts)} texts for {ids.shape[0]} sources")
    if limit is not None and ids.shape[1] > limit[0]:
        longest = int(mask.sum(1).argmax()) if mask.numel() else 0
        raise TargetError(
            f"{where}: sources span {ids.shape[1]} positions, more than the model's "
            f"position limit of {limit[0]} ({limit[1]}); the longest is "
            f"{batch.texts[longest][:60]!r}. Truncate or drop longer sources in batches() "
            f"(from_hf truncates to the limit with a warning)")


def _check_ids(name: str, emitted: Any, rows: int) -> None:
    if (not isinstance(emitted, torch.Tensor) or emitted.ndim != 2 or emitted.shape[0] != rows
            or emitted.is_floating_point() or emitted.is_complex()
            or emitted.dtype == torch.bool):
        got = (f"{emitted.dtype} {tuple(emitted.shape)}" if isinstance(emitted, torch.Tensor)
               else type(emitted).__name__)
        raise TargetError(f"target {name!r}: greedy must return integer ids of shape "
                          f"(batch={rows}, steps), got {got}")
    if emitted.numel() and int(emitted.min()) < 0:
        raise TargetError(f"target {name!r}: greedy returned negative token ids (smallest "
                          f"{int(emitted.min())}); pad finished outputs with a real id")


def _check_logits(name: str, what: str, logits: Any, lead: tuple[int, ...],
                  fewer_steps: bool = False) -> torch.Tensor:
    """``logits`` must be floating (*lead, V): (B, T, V) per step, (B, V) for one step;
    ``fewer_steps``: (B, T', V) with 1 <= T' <= T is allowed too (a decoding that stopped
    once every row had ended)."""
    shape = tuple(logits.shape[:-1]) if isinstance(logits, torch.Tensor) else ()
    if fewer_steps and len(shape) == 2 and shape[0] == lead[0] and 1 <= shape[1] <= lead[1]:
        lead = shape
    if (not isinstance(logits, torch.Tensor) or not logits.is_floating_point()
            or logits.ndim != len(lead) + 1 or shape != lead):
        got = (f"{logits.dtype} {tuple(logits.shape)}" if isinstance(logits, torch.Tensor)
               else type(logits).__name__)
        axes = "(batch, steps, vocab)" if len(lead) == 2 else "(batch, vocab)"
        raise TargetError(f"target {name!r}: {what} must return floating logits {axes} = "
                          f"{lead} + (V,), got {got}")
    return logits
