"""Causal LMs that build their own input from the token ids: what a target must do to run
them as their own ``generate()`` runs them.

A causal LM is normally given ids (or embeddings), an attention mask and position ids, and
its ``generate()`` steps are its one pass cut into positions. :func:`own_input` says where
a model departs from that, read from the model-facts table
(:mod:`attnaudit.capturing.model_facts`, where a user registers an entry for their own
model); the built-in entry is CPM-Ant's (``model_type`` ``"cpmant"``), whose forward

- prepends ``config.prompt_length`` learned prompt positions of its own to every sequence,
  so every attention call runs over that many keys before the sequence's
  (:attr:`OwnInput.lead`: the prompt views' leading keys, whose weight is counted as a
  sink's, :mod:`attnaudit.capturing.views`), and its cache holds them;
- takes padding from the ids, not from its ``attention_mask`` (a dummy): id 0 is padding,
  and a row's last ``count of non-zero ids`` positions are its tokens, so prompts are
  left-padded with 0 (:attr:`OwnInput.pad_id`) and a prompt token with id 0 is refused;
- lets every position attend to every other in one pass (its mask builder marks every
  position as context), while its ``generate()`` is a prefix LM: the prefill's positions
  (learned prompt and prompt) attend to one another, and each continuation token to what
  came before it, one cached step at a time. A teacher-forced pass therefore gives the
  model's own mask builder the context ``generate()`` realises — the learned positions and
  the prompt, not the continuation (:meth:`OwnInput.context`) — so that its rows and logits
  are the steps' (the bidirectional pass would let the prompt read the continuation);
- wants the whole sequence's ids in a cached step and cuts the cached positions off itself
  (:attr:`OwnInput.whole_ids_per_step`).

Its padding id is never given after a continuation's end either: ``generate()`` pads a
finished row with it, which the model would read as padding of the whole row, so those
positions (after every audited step, which none of them precedes) are given the
end-of-sequence id (:meth:`OwnInput.finished`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from attnaudit.capturing.model_facts import model_facts
from attnaudit.errors import TargetError

MASK_BUILDER = "_prepare_attention_mask"  # CPM-Ant's base model's mask builder


@dataclass(frozen=True)
class OwnInput:
    """How a causal LM builds its input beyond the given ids (module docstring).

    pad_id: the id the model reads as padding (None: it reads the attention mask). lead:
    positions of its own the model prepends to every sequence (keys before the sequence's
    in every attention call; cached). whole_ids_per_step: a cached step is given the whole
    sequence's ids, not the new position's. prefix_context: one pass attends both ways
    unless its mask builder is told which positions are context (:meth:`context`).
    """

    pad_id: int | None = None
    lead: int = 0
    whole_ids_per_step: bool = False
    prefix_context: bool = False

    def context(self, model: nn.Module, prompt_length: int) -> AbstractContextManager[None]:
        """Within the block, one pass of ``model`` attends as its ``generate()`` does: the
        lead and the first ``prompt_length`` positions of the sequence are context (attend
        to one another), later ones attend causally; the model is left as it was after."""
        if not self.prefix_context:
            return nullcontext()
        return _prefix_context(model, self.lead + prompt_length)

    def finished(self, emitted: torch.Tensor, eos_id: int) -> torch.Tensor:
        """``emitted`` (B, T) with the padding id after a row's first ``eos_id`` replaced by
        ``eos_id`` (itself when the model reads padding from the mask)."""
        if self.pad_id is None:
            return emitted
        is_eos = emitted == eos_id
        after = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
        return emitted.masked_fill(after & (emitted == self.pad_id), eos_id)


def own_input(model: nn.Module) -> OwnInput:
    """What ``model`` builds from its ids itself (:class:`OwnInput`), as the table of model
    facts gives it for the model's architecture (its ``config.model_type``, else its class
    name: :mod:`attnaudit.capturing.model_facts`); the defaults for a model that builds
    nothing."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    facts = model_facts(model_type) if isinstance(model_type, str) else None
    facts = facts or model_facts(type(model).__name__)
    if facts is None:
        return OwnInput()
    return OwnInput(pad_id=facts.pad_id, lead=facts.lead_for(config),
                    whole_ids_per_step=facts.whole_ids_per_step,
                    prefix_context=facts.prefix_context)


@contextmanager
def _prefix_context(model: nn.Module, context_length: int) -> Iterator[None]:
    """The base model's mask builder, ``(input_ids, span, context, length) -> mask``, given a
    ``context`` (B, L) that marks only the first ``context_length`` positions (of the
    sequence as the model prepends it), for the duration of the block."""
    base = getattr(model, "base_model", model)
    build: Callable[..., torch.Tensor] | None = getattr(base, MASK_BUILDER, None)
    if build is None:
        raise TargetError(f"{type(model).__name__}: its base model has no {MASK_BUILDER} to "
                          "give a prompt's context, so one pass would attend both ways where "
                          "its generate() attends causally")
    def prefix(input_ids: torch.Tensor, span: torch.Tensor, context: torch.Tensor,
               length: torch.Tensor) -> torch.Tensor:
        context = context.clone()
        context[:, context_length:] = 0
        return build(input_ids, span, context, length)

    shadowed = vars(base).get(MASK_BUILDER)
    setattr(base, MASK_BUILDER, prefix)
    try:
        yield
    finally:
        if shadowed is None:
            delattr(base, MASK_BUILDER)
        else:
            setattr(base, MASK_BUILDER, shadowed)


def refuse_padding_ids(ids: torch.Tensor, mask: torch.Tensor, pad_id: int | None,
                       model: Any) -> None:
    """A TargetError when a real prompt token (``mask`` True) of ``ids`` (B, P) is the id
    the model reads as padding: it would drop that token, and the prompt would not line
    up with its mask."""
    if pad_id is None or not bool((ids[mask] == pad_id).any()):
        return
    rows = sorted({int(r) for r in (ids == pad_id).logical_and(mask).nonzero()[:, 0]})
    raise TargetError(f"{type(model).__name__} reads id {pad_id} as padding, and prompt(s) "
                      f"{rows} hold it as a token; the model would drop it (remove that "
                      "token from the prompts)")
