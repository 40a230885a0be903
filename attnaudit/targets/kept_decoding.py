"""The logits of a Hugging Face target's latest decoding, kept for its ``cached_decode``.

The validity audit compares what the model's own cached decoding computes along the audited
output (``cached_decode``: ``generate()`` forced along it,
:func:`~attnaudit.targets.decoding.forced_logits`) with the one teacher-forced pass. A
one-hypothesis decoding (greedy or seeded sampling) has just computed exactly those logits
while producing the output (``generate(output_logits=True)``: the raw logits, before any
processor, of each step from the model's own cache), so a target keeps them
(:class:`KeptDecoding`) and its next ``cached_decode`` of the same inputs and output returns
them instead of decoding a second time: on a billion-parameter model that is one
``generate()`` call per batch, two thirds of the model's own work on a short output.

They are kept only when nothing could make a second decoding differ: no capture is active
while decoding (an edit held through it would change them), the model's mode and every
parameter's and buffer's version counter are as they were (an in-place change of a weight
bumps its counter), and the inputs and output are equal; one decoding at a time, taken
once, and only while its float32 logits fit :data:`KEPT_LOGITS_BYTES`. A beam search's
logits belong to its beams, not to the returned hypothesis: it keeps none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from attnaudit.capturing.state import ACTIVE
from attnaudit.targets.decoding import Decoding, forced_logits

KEPT_LOGITS_BYTES = 1 << 28  # the largest (B, T, V) float32 logits a target keeps


@dataclass
class _Decoded:
    inputs: dict[str, Any]
    emitted: torch.Tensor  # (B, T) long
    logits: torch.Tensor  # (B, T, V) float32
    state: tuple[object, ...]


@dataclass
class KeptDecoding:
    """One target's latest decoding's logits: :meth:`generate` decodes (and keeps them),
    :meth:`forced` returns them for the same inputs and output or decodes again."""

    _last: _Decoded | None = None

    def generate(self, decoding: Decoding, model: nn.Module, lead: int,
                 **inputs: Any) -> torch.Tensor:
        """``decoding.generate(model, **inputs)``: the sequences (B, L), whose first ``lead``
        columns are not output (the prompt, or the decoder's start token)."""
        self._last = None
        steps = decoding.max_new_tokens or decoding.settings.get("max_length")
        vocab = _vocabulary(model)
        keeps = (decoding.num_beams == 1 and ACTIVE.capture is None and vocab is not None
                 and steps is not None
                 and inputs["input_ids"].shape[0] * int(steps) * vocab * 4 <= KEPT_LOGITS_BYTES)
        sequences, logits = decoding.generate(model, logits=keeps, **inputs)
        emitted = sequences[:, lead:]
        if logits and len(logits) == emitted.shape[1]:
            self._last = _Decoded(dict(inputs), emitted, torch.stack(logits, dim=1).float(),
                                  _state(model))
        return sequences

    def forced(self, model: nn.Module, emitted: torch.Tensor, **inputs: Any) -> torch.Tensor:
        """Logits (B, T', V) of ``emitted`` (B, T) as ``generate()`` computes them: the kept
        ones when they are of these inputs and this output on the model as it is, else
        :func:`~attnaudit.targets.decoding.forced_logits`."""
        last, self._last = self._last, None
        if last is not None and _same(last, model, emitted, inputs):
            return last.logits
        return forced_logits(model, emitted, **inputs)


def _vocabulary(model: nn.Module) -> int | None:
    """The width of the model's logits: its output embedding's rows, else its config's
    ``vocab_size`` (None when neither says). A shape only: an offloaded head is not read."""
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    weight = getattr(head, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.ndim == 2:
        return int(weight.shape[0])
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    return vocab if isinstance(vocab, int) else None


def _state(model: nn.Module) -> tuple[object, ...]:
    """The model's mode and the identity and version counter of every parameter and buffer."""
    tensors = [*model.parameters(), *model.buffers()]
    return (model.training, *((id(t), t._version) for t in tensors))


def _same(last: _Decoded, model: nn.Module, emitted: torch.Tensor,
          inputs: dict[str, Any]) -> bool:
    if set(inputs) != set(last.inputs) or last.emitted.shape != emitted.shape:
        return False
    for key, value in inputs.items():
        kept = last.inputs[key]
        if isinstance(value, torch.Tensor) != isinstance(kept, torch.Tensor):
            return False
        if isinstance(value, torch.Tensor):
            if value.shape != kept.shape or not torch.equal(value, kept.to(value.device)):
                return False
        elif value != kept:
            return False
    return (torch.equal(emitted, last.emitted.to(emitted.device))
            and _state(model) == last.state)
