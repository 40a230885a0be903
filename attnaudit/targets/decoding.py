"""How a Hugging Face target decodes the output it audits: :class:`Decoding`.

A deployed model decodes with its own generation settings (``model.generation_config``:
beams, length penalty, length limits, forced BOS/EOS, no-repeat n-grams, bad words ...), so
by default (``mode="model"``) a target decodes as ``model.generate`` does with nothing
passed but the overrides; ``mode="greedy"`` takes the argmax at every step (one hypothesis,
no sampling) whatever the config says, the other settings (length, forced tokens, n-gram
and word bans) still applying. The audited output of a source is the one hypothesis
``generate`` returns (the best beam), and every protocol teacher-forces it.

Sampling is refused unless seeded: with ``seed``, every decoding call draws from a torch
generator state seeded afresh (the caller's random state is restored afterwards), so the
same batch always gives the same output, and an edited re-decoding draws the same noise as
the unedited one. Nothing here imports transformers at module level.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn

from attnaudit.errors import TargetError

DECODING_MODES = ("model", "greedy")
DEFAULT_MAX_NEW_TOKENS = 64  # when neither the caller nor the model's config sets a limit
# What the target itself sets on every call: the contract's ids, one returned hypothesis.
TARGET_OWNED = ("pad_token_id", "eos_token_id", "decoder_start_token_id",
                "num_return_sequences")
# Generation-config entries that say nothing about which output is produced.
NOT_DECODING = ("transformers_version", "bos_token_id", "use_cache", "return_dict_in_generate",
                "output_scores", "output_logits", "output_attentions", "output_hidden_states",
                "cache_implementation", "cache_config", "compile_config", *TARGET_OWNED)
LENGTH_KEYS = ("max_new_tokens", "max_length")
POSITIVE = ("num_beams", *LENGTH_KEYS)  # checked here: transformers fails late on them


@dataclass(frozen=True)
class Decoding:
    """The decoding settings a target's outputs come from, as used.

    mode: ``"model"`` (the model's generation config, with overrides) or ``"greedy"``.
    settings: the decoding entries in effect, JSON-ready: what the model's generation config
        sets (beyond transformers' defaults) updated with the overrides, token ids and output
        flags left out. Exactly one of ``max_new_tokens`` / ``max_length`` is among them.
    overrides: the ``generate`` keyword arguments passed on top of the model's own config.
    seed: seeds sampling (None: the settings do not sample).
    """

    mode: str
    settings: Mapping[str, Any]
    overrides: Mapping[str, Any] = field(default_factory=dict)
    seed: int | None = None

    @property
    def num_beams(self) -> int:
        return int(self.settings.get("num_beams") or 1)

    @property
    def samples(self) -> bool:
        return bool(self.settings.get("do_sample"))

    @property
    def max_new_tokens(self) -> int | None:
        """The limit on new tokens, or None when the limit is a total ``max_length``."""
        return self.settings.get("max_new_tokens")

    @property
    def search(self) -> str:
        """``greedy``, ``beam search (N beams)`` or ``sampling``."""
        if self.samples:
            return "sampling"
        return f"beam search ({self.num_beams} beams)" if self.num_beams > 1 else "greedy"

    @property
    def limit_text(self) -> str:
        """`` (at most N new tokens)``, or `` (at most N tokens in all)`` for a total limit."""
        if self.max_new_tokens is not None:
            return f" (at most {self.max_new_tokens} new tokens)"
        return f" (at most {self.settings.get('max_length')} tokens in all)"

    def describe(self) -> str:
        """One sentence for reports, e.g. ``beam search (4 beams), the model's generation
        config (length_penalty=0.6, max_length=512, num_beams=4); ...``."""
        origin = ("by request, over the model's generation config" if self.mode == "greedy"
                  else "the model's generation config")
        changed = self.requested
        if changed:
            origin += " with " + ", ".join(f"{k}={v!r}" for k, v in changed.items())
        shown = ", ".join(f"{k}={v!r}" for k, v in self.settings.items())
        seeded = f", seed {self.seed}" if self.seed is not None else ""
        joint = " " if self.mode == "greedy" else ", "
        return (f"{self.search}{joint}{origin} ({shown}{seeded}); the returned (best) hypothesis "
                "is audited")

    @property
    def requested(self) -> dict[str, Any]:
        """The overrides the caller asked for (greedy's own and the target's left out)."""
        implied = ("do_sample", "num_beams") if self.mode == "greedy" else ()
        return {k: v for k, v in self.overrides.items()
                if k not in TARGET_OWNED and k not in implied}

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: mode, settings, overrides and seed (for the manifest)."""
        return {"mode": self.mode, "settings": dict(self.settings),
                "overrides": self.requested,
                "seed": self.seed}

    @torch.no_grad()
    def generate(self, model: nn.Module, *, logits: bool = False, **inputs: Any
                 ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """``model.generate(**inputs)`` with these settings: the returned sequences
        ``(B, L)``, one per input, and with ``logits`` the raw logits (B, V) of each
        generated step (``output_logits``; else ``()``). A sampling decoding runs from a
        fresh generator state seeded with :attr:`seed`; the caller's random state is
        restored afterwards."""
        if logits:
            inputs = {**inputs, "output_logits": True, "return_dict_in_generate": True}
        with nullcontext() if not self.samples else _seeded(int(self.seed)):  # type: ignore[arg-type]
            out = _generate(model)(**inputs, **self.overrides)
        return (out.sequences, tuple(out.logits or ())) if logits else (out, ())


@contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Torch's random state seeded with ``seed`` inside, the caller's restored after."""
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        yield


def resolve_decoding(model: nn.Module, *, mode: str = "model",
                     generation: Mapping[str, Any] | None = None, seed: int | None = None,
                     max_new_tokens: int | None = None) -> Decoding:
    """The :class:`Decoding` of ``model`` (a Hugging Face model with ``generation_config``).

    Args:
        mode: ``"model"`` or ``"greedy"`` (see the module docstring).
        generation: ``generate`` keyword arguments overriding the model's config (e.g.
            ``{"num_beams": 2, "length_penalty": 1.0}``); checked against the model's
            ``GenerationConfig``.
        seed: seeds sampling; required when the settings sample.
        max_new_tokens: the limit on new tokens (default: the model's config's
            ``max_new_tokens`` or ``max_length`` when it sets one, else 64).

    Raises TargetError for an unknown mode or setting, settings the target owns (token ids,
    ``num_return_sequences``), settings transformers rejects, and sampling without a seed.
    """
    if mode not in DECODING_MODES:
        raise TargetError(f"decoding must be one of {', '.join(DECODING_MODES)}, got {mode!r}")
    generation = dict(generation or {})
    owned = sorted(set(generation) & set(TARGET_OWNED))
    if owned:
        raise TargetError(f"generation settings {owned} are set by the target (its end, "
                          "padding and start ids, and one returned hypothesis: the audited "
                          "output); leave them out")
    if max_new_tokens is not None and any(k in generation for k in LENGTH_KEYS):
        raise TargetError("give the length limit once: max_new_tokens, or max_new_tokens / "
                          "max_length in generation, not both")
    for key in POSITIVE:
        value = generation.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TargetError(f"generation setting {key} must be a positive integer, "
                              f"got {value!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TargetError(f"seed must be an integer, got {seed!r}")
    config = getattr(model, "generation_config", None)
    if config is None:
        raise TargetError(f"{type(model).__name__} has no generation_config to decode with")
    overrides = _overrides(config, mode, generation, max_new_tokens)
    settings = _settings(config, overrides)
    decoding = Decoding(mode, settings, {**overrides, "num_return_sequences": 1}, seed)
    if decoding.samples and seed is None:
        raise TargetError(
            "the decoding samples (do_sample=True, from the model's generation config or the "
            "overrides), so two audits would explain different outputs: give a seed "
            "(--seed N, from_hf(..., seed=N)) or decode greedily (--decoding greedy)")
    return decoding


def _overrides(config: Any, mode: str, generation: dict[str, Any],
               max_new_tokens: int | None) -> dict[str, Any]:
    """The ``generate`` keyword arguments on top of the model's config: greedy's, the
    caller's, and a length limit when nothing else sets one."""
    overrides: dict[str, Any] = {}
    if mode == "greedy":
        searched = {k: generation[k] for k in ("num_beams", "do_sample")
                    if k in generation and generation[k] not in (1, False)}
        if searched:
            raise TargetError(f"decoding 'greedy' takes one hypothesis without sampling; "
                              f"drop {searched} or decode with the model's settings")
        overrides.update(do_sample=False, num_beams=1)
    overrides.update(generation)
    if max_new_tokens is not None:
        overrides["max_new_tokens"] = max_new_tokens
    elif not any(k in generation or k in _model_set(config) for k in LENGTH_KEYS):
        overrides["max_new_tokens"] = DEFAULT_MAX_NEW_TOKENS
    return overrides


def _model_set(config: Any) -> dict[str, Any]:
    """What the model's generation config sets beyond transformers' defaults."""
    return {k: v for k, v in config.to_diff_dict().items() if v is not None}


def _settings(config: Any, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The decoding entries in effect (see :class:`Decoding`), checked by transformers."""
    effective = copy.deepcopy(config)
    try:
        unknown = effective.update(**overrides)
    except ValueError as exc:
        raise TargetError(f"generation settings {dict(overrides)}: {exc}") from None
    if unknown:
        raise TargetError(f"unknown generation settings {sorted(unknown)}: give "
                          "GenerationConfig attributes (num_beams, length_penalty, "
                          "max_new_tokens, no_repeat_ngram_size ...)")
    settings = {k: v for k, v in _model_set(effective).items() if k not in NOT_DECODING}
    if "max_new_tokens" in settings:  # generate() lets max_new_tokens win over max_length
        settings.pop("max_length", None)
    return dict(sorted(settings.items()))


def describe_decoding(decoding: Decoding | None) -> str:
    """One sentence on a target's decoding; None: a hand-written target's own function."""
    if decoding is None:
        return "the target's own greedy function (a hand-written target decodes its own way)"
    return decoding.describe()


def decoding_record(decoding: Decoding | None) -> dict[str, Any]:
    """The manifest's ``decoding`` entry (see :meth:`Decoding.as_dict`)."""
    if decoding is None:
        return {"mode": "target", "settings": {}, "overrides": {}, "seed": None,
                "note": describe_decoding(None)}
    return decoding.as_dict()


def forced_logits(model: nn.Module, emitted: torch.Tensor, **inputs: Any) -> torch.Tensor:
    """Logits (B, T', V), T' <= T: what the model's own ``generate()`` computes at each step
    when every step's token is forced to be ``emitted`` (B, T)'s: ``model.generate(**inputs)``
    greedy with one beam and a logits processor that puts all the mass on the emitted token,
    returning its raw logits (before any processor). The source or prompt runs once, then
    one position per step from the model's own cache, with the model's own inputs and
    positions: exactly its decoding of that output. T' < T when every row ended first."""
    from transformers import LogitsProcessor, LogitsProcessorList

    class Forced(LogitsProcessor):
        """Scores (B, V) -> all mass on the emitted token of the step (0 logit, -inf else)."""

        start: int | None = None  # the length of the ids generate() starts from

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            self.start = input_ids.shape[1] if self.start is None else self.start
            token = emitted[:, input_ids.shape[1] - self.start].to(scores.device)
            return torch.full_like(scores, -torch.inf).scatter_(1, token[:, None], 0.0)

    out = _generate(model)(**inputs, logits_processor=LogitsProcessorList([Forced()]),
                           do_sample=False, num_beams=1, num_return_sequences=1,
                           max_new_tokens=emitted.shape[1], output_logits=True,
                           return_dict_in_generate=True)
    return torch.stack(out.logits, dim=1)


def _generate(model: nn.Module) -> Callable[..., Any]:
    """A Hugging Face model's ``generate`` (nn.Module types unknown attributes as tensors or
    modules, so the method's type is stated here)."""
    return cast(Callable[..., Any], model.generate)
