"""DeepLift and GradientShap of each emitted token to the source tokens (source side only).

Both measure against the baseline of integrated gradients: the embedding of one token at every
source position (``baseline``: ``"pad"``, ``"unk"`` or an id; see
:func:`attnaudit.interventions.attribution.resolve_baseline_id`). ``x`` is the embedded source
(R, n, d), ``b`` the baseline, ``f`` the attributed output of one target step; both return
attribution vectors (R, w, n, d) that the caller reduces over ``d`` like integrated gradients.

- ``deeplift``: Captum's ``DeepLift`` (rescale rule, ``multiply_by_inputs``) run on
  :class:`StepOutputs`, a module that holds the model and runs the teacher-forced pass with
  the source embedding replaced, one target step at a time (Captum's hooks hold the
  activations of one pass, so a step costs a forward pass over the input and baseline rows
  and one backward pass). Captum's rules apply only at nonlinearities that are modules of
  the types it lists (``nn.ReLU``, ``nn.Tanh``, ``nn.Sigmoid``, ``nn.Softmax`` ...), each
  called once per pass; every other operation (softmax and activations called as
  functions, ``GELUActivation``, LSTM gates) passes its plain gradient. On a model without
  such modules (both bundled date models; Hugging Face BART) DeepLift reduces to
  ``(x - b) * df/dx`` at the input. :func:`rule_modules` names the modules the rules apply
  to, and the variant text says which case ran.
- ``gradient_shap``: expected gradients over a baseline distribution, as Captum's
  ``GradientShap``: per example, ``n_samples`` baselines ``b_k = b + stdev * eps_k`` (Gaussian
  noise at each real source position, 0 at padding) and ``alpha_k ~ U(0, 1)``, drawn from a
  generator seeded by (target seed, global example index) so that they do not depend on
  batching (:func:`shap_draws`); attribution ``mean_k df/dx(b_k + alpha_k (x - b_k)) *
  (x - b_k)``. The draws serve every step of an example, so one forward pass per sample
  serves all steps.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch
from captum.attr import DeepLift
from captum.attr._core.deep_lift import SUPPORTED_NON_LINEAR
from torch import nn

from attnaudit.interventions.runner import seeded_generator

if TYPE_CHECKING:
    from attnaudit.interventions.attribution import _Inputs, _Passes

SHAP_SALT = 5
SHAP_SAMPLES = 8
SHAP_STDEV = 0.1


class StepOutputs(nn.Module):
    """The attributed outputs (R, w) of a forward pass as a module holding the model, so that
    Captum's DeepLift finds (and hooks) the model's nonlinearity modules."""

    def __init__(self, model: nn.Module, outputs: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.model = model
        self._outputs = outputs

    def forward(self, embedded: torch.Tensor) -> torch.Tensor:
        """(R, n, d) embedded source -> (R, w) attributed outputs."""
        return self._outputs(embedded)


def rule_modules(model: nn.Module) -> tuple[str, ...]:
    """The type names of ``model``'s modules at which Captum's DeepLift applies its rules."""
    return tuple(sorted({type(m).__name__ for m in model.modules()
                         if type(m) in SUPPORTED_NON_LINEAR}))


def deeplift_vectors(passes: _Passes, inputs: _Inputs, per_pass: int
                     ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Captum DeepLift attributions: yields ``(rows (R,), vectors (R, w, n, d))`` a chunk of
    examples at a time (the chunk's input and baseline rows share a pass)."""
    width = inputs.emitted.shape[1]
    for rows in torch.arange(len(passes.batch)).split(max(per_pass // 2, 1)):
        both = rows.repeat(2)  # Captum runs the inputs, then the baselines, in one batch

        def outputs(embedded: torch.Tensor, both: torch.Tensor = both) -> torch.Tensor:
            return passes.outputs(both, inputs.emitted, inputs.contrast, embedded)[0]

        explainer = DeepLift(StepOutputs(passes.target.model, outputs))
        source, base = inputs.source[rows], inputs.source_base[rows]
        vectors = torch.zeros(len(rows), width, *source.shape[1:], dtype=torch.float32,
                              device=source.device)
        with torch.enable_grad(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Setting forward, backward hooks")
            for step in range(width):
                leaf = source.detach().clone().requires_grad_()
                vectors[:, step] = explainer.attribute(leaf, baselines=base,
                                                       target=step).detach().float()
        yield rows, vectors


def shap_draws(generator: torch.Generator, base: torch.Tensor, real: torch.Tensor,
               n_samples: int, stdev: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One example's GradientShap draws: baselines (K, n, d) = ``base`` (n, d) + ``stdev`` x
    standard normal noise at the ``real`` (n,) bool positions, and ``alpha`` (K,) ~ U(0, 1)."""
    alphas = torch.rand(n_samples, generator=generator)
    noise = torch.zeros(n_samples, *base.shape)
    noise[:, real.cpu()] = torch.randn(n_samples, int(real.sum()), base.shape[-1],
                                       generator=generator)
    return base + stdev * noise.to(base.device, base.dtype), alphas


def gradient_shap_vectors(passes: _Passes, inputs: _Inputs, per_pass: int, n_samples: int,
                          stdev: float, seed: int, first_example: int
                          ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """GradientShap attributions: yields ``(rows (R,), vectors (R, w, n, d))`` a chunk of
    examples at a time, each with all its samples (split when they exceed a pass)."""
    width = inputs.emitted.shape[1]
    real = passes.batch.source_mask
    samples_per_pass = min(n_samples, per_pass)
    for chunk in torch.arange(len(passes.batch)).split(max(per_pass // n_samples, 1)):
        draws = [shap_draws(seeded_generator(seed, first_example + int(e), 0, SHAP_SALT),
                            inputs.source_base[e], real[e], n_samples, stdev) for e in chunk]
        starts = torch.stack([s for s, _ in draws])  # (C, K, n, d)
        alphas = torch.stack([a for _, a in draws])  # (C, K)
        source = inputs.source[chunk]
        total = torch.zeros(len(chunk), width, *source.shape[1:], dtype=torch.float32,
                            device=source.device)
        for at in range(0, n_samples, samples_per_pass):
            start = starts[:, at : at + samples_per_pass]
            alpha = alphas[:, at : at + samples_per_pass].to(start.device, start.dtype)
            diff = source[:, None] - start
            path = (start + alpha[..., None, None] * diff).flatten(0, 1)
            rows = chunk.repeat_interleave(start.shape[1])
            for step, grads, _ in passes.gradients(rows, inputs, path, None, False):
                total[:, step] += (grads.unflatten(0, start.shape[:2]).float()
                                   * diff.float()).sum(1)
        yield chunk, total / n_samples
