"""Gradients of every target step's attributed output from one shared forward pass.

A teacher-forced pass over the whole emitted output gives the attributed output of every step
at once, ``(R, T)``; the gradient of each step's column with respect to the embedded inputs
then comes from one backward pass over that retained graph (:func:`step_gradients`). So an
example costs one forward pass per input point (one for saliency, one per integration point
for integrated gradients) instead of one per target step, and its ``T`` backward passes
only go back through the graph. (A single backward batched over the steps,
``torch.autograd.grad(..., is_grads_batched=True)``, gave the same numbers but ran slower on
the bundled models, and holds one gradient copy of the pass per step.) Rows never mix, so
one backward pass serves every row of a pass; the rows per pass follow a memory budget
(:func:`~attnaudit.interventions.memory.whole_passes`).

The embedded inputs are the output of the **first call** of ``target.source_embedding``
(the encoder's call when a decoder shares the module) and, when asked, the calls of
``target.target_embedding`` (the decoder's input tokens: one call ``(R, T, d)``, or one call
per step ``(R, d)``); :class:`EmbeddingCalls` records or replaces them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from attnaudit.errors import InterventionError

OUTPUTS = ("prob", "logprob", "logit", "entropy", "contrast", "contrast_logit")
OUTPUT_VARIANTS = {
    "prob": "p(y_t | y_<t, x), the softmax probability of the emitted token",
    "logprob": "log p(y_t | y_<t, x)",
    "logit": "the emitted token's logit (before the softmax)",
    "entropy": "H(p(. | y_<t, x)), the entropy of the output distribution after the emitted "
               "prefix, in nats",
    "contrast": "p(y_t | y_<t, x) - p(c_t | y_<t, x): emitted minus contrast token "
                "probability, both after the emitted prefix",
    "contrast_logit": "logit(y_t) - logit(c_t): emitted minus contrast token logit, after the "
                      "emitted prefix",
}
NOT_CALLED = ("target.source_embedding was not called in the forward pass; it must be the "
              "module that embeds the source tokens")


def attributed_output(logits: torch.Tensor, emitted: torch.Tensor, output: str,
                      contrast: torch.Tensor | None = None) -> torch.Tensor:
    """What is attributed at each step, float32 (R, T), from logits (R, T, V), the emitted
    ids (R, T) and, for the contrast outputs, the contrast ids (R, T)."""
    logits = logits.float()
    if output == "entropy":
        logp = torch.log_softmax(logits, -1)
        return -(logp.exp() * logp).sum(-1)
    if output in ("prob", "contrast"):
        scores = torch.softmax(logits, -1)
    elif output == "logprob":
        scores = torch.log_softmax(logits, -1)
    else:
        scores = logits
    picked = scores.gather(-1, emitted[..., None]).squeeze(-1)
    if output.startswith("contrast"):
        assert contrast is not None
        picked = picked - scores.gather(-1, contrast[..., None]).squeeze(-1)
    return picked


@dataclass
class EmbeddingCalls:
    """Forward hooks on the source embedding (first call) and, with ``prefix_module``, on the
    target embedding (its other calls): they record what the calls return or, with
    ``source`` / ``prefix`` given, return those tensors instead.

    source: (R, n, d) replacement of the source call. prefix: (R, T, d) replacement of the
    decoder's input embeddings (sliced per call when the decoder embeds one step per call).
    After a pass, ``recorded_source`` (R, n, d) and ``recorded_prefix`` (R, T', d) hold what
    the calls returned (before replacement).
    """

    source_module: nn.Module
    prefix_module: nn.Module | None = None
    source: torch.Tensor | None = None
    prefix: torch.Tensor | None = None
    recorded_source: torch.Tensor | None = None
    prefix_calls: list[torch.Tensor] = field(default_factory=list)

    def _hook(self, module: nn.Module, _args: object, output: torch.Tensor
              ) -> torch.Tensor | None:
        if module is self.source_module and self.recorded_source is None:
            self.recorded_source = output
            return self._checked(output, self.source, "source embedding's first call")
        if module is not self.prefix_module:
            return None
        at = sum(1 if p.ndim == 2 else p.shape[1] for p in self.prefix_calls)
        self.prefix_calls.append(output)
        if self.prefix is None:
            return None
        if isinstance(output, torch.Tensor) and output.ndim == 2:
            return self._checked(output, self.prefix[:, at], f"target embedding's call {at}")
        return self._checked(output, self.prefix, "target embedding's call")

    @staticmethod
    def _checked(output: object, value: torch.Tensor | None, what: str) -> torch.Tensor | None:
        if value is None:
            return None
        if not isinstance(output, torch.Tensor) or output.shape != value.shape:
            got = tuple(output.shape) if isinstance(output, torch.Tensor) else type(output)
            raise InterventionError(f"the {what} returned {got}, expected {tuple(value.shape)}")
        return value

    @property
    def recorded_prefix(self) -> torch.Tensor | None:
        """The decoder's input embeddings (R, T', d), or None when never called."""
        if not self.prefix_calls:
            return None
        parts = [p[:, None] if p.ndim == 2 else p for p in self.prefix_calls]
        return torch.cat(parts, 1)

    @contextmanager
    def active(self) -> Iterator[EmbeddingCalls]:
        """Hooks registered for one forward pass, removed after it; raises when a needed call
        did not happen."""
        modules = {id(m): m for m in (self.source_module, self.prefix_module) if m is not None}
        handles = [m.register_forward_hook(self._hook) for m in modules.values()]
        try:
            yield self
            if self.recorded_source is None:
                raise InterventionError(NOT_CALLED)
            if self.prefix_module is not None and not self.prefix_calls:
                raise InterventionError("target.target_embedding was not called after the "
                                        "source embedding; it must embed the decoder's input "
                                        "tokens")
        finally:
            for handle in handles:
                handle.remove()


def step_gradients(outputs: torch.Tensor, leaves: tuple[torch.Tensor, ...]
                   ) -> Iterator[tuple[int, tuple[torch.Tensor, ...]]]:
    """Gradients of each column of ``outputs`` (R, T) with respect to ``leaves`` (each
    (R, ...)), one backward pass per step over the one retained forward graph.

    Yields ``(step, grads)`` with each grad (R, ...) (zeros where a leaf does not reach the
    step). Rows must not mix (row r of the output depends on row r of the leaves only), so
    one backward pass serves all rows.
    """
    n_steps = outputs.shape[1]
    for step in range(n_steps):
        grads = torch.autograd.grad(outputs[:, step].sum(), leaves,
                                    retain_graph=step + 1 < n_steps, allow_unused=True)
        yield step, tuple(torch.zeros_like(leaf) if g is None else g
                          for g, leaf in zip(grads, leaves, strict=True))
