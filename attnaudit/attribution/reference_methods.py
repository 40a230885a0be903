"""DeepLift and GradientShap of each emitted token to the source tokens (and the output prefix).

Both measure against the baseline of integrated gradients: the embedding of one token at every
source position (``baseline``: ``"pad"``, ``"unk"`` or an id; see
:func:`attnaudit.attribution.inputs.resolve_baseline_id`), and with target-side
attribution at every decoder input position too. ``x`` is the embedded source (R, n, d) (and
the decoder's input embeddings (R, T, d)), ``b`` its baseline, ``f`` the attributed output of
one target step; both yield attribution vectors (R, w, n, d) (and (R, w, T, d)) that the
caller reduces over ``d`` like integrated gradients.

- ``deeplift``: Captum's ``DeepLift`` (rescale rule, ``multiply_by_inputs``). Captum's rules
  apply only at nonlinearities that are modules of the types it lists (``nn.ReLU``,
  ``nn.Tanh``, ``nn.Sigmoid``, ``nn.Softmax`` ...), each called once per pass; every other
  operation (softmax and activations called as functions, ``GELUActivation``, LSTM gates)
  passes its plain gradient. So on a model without such modules (both bundled date models;
  Hugging Face BART and Marian) DeepLift is ``(x - b) * df/dx`` at the input, and
  :mod:`attnaudit.attribution.gradient_methods` computes it from the shared forward pass as it
  does input x gradient (one teacher-forced pass per chunk of examples, one backward pass per
  step; attention not held constant). On a model with such modules,
  :func:`deeplift_vectors` runs Captum's ``DeepLift`` on :class:`StepOutputs`, a module that
  holds the model and runs the teacher-forced pass with the embeddings replaced, one target
  step at a time (Captum's hooks hold the activations of one pass, so a step costs a forward
  pass over the input and baseline rows and one backward pass); with target-side attribution
  the source and the decoder's input embeddings are its two inputs, each with its baseline.
  :func:`rule_modules` names the modules the rules apply to, and the variant text says which
  case ran.
- ``gradient_shap``: expected gradients over a baseline distribution, as Captum's
  ``GradientShap``: per example, ``n_samples`` baselines ``b_k = b + stdev * eps_k`` (Gaussian
  noise at each real source position, 0 at padding; with target-side attribution also at
  each decoder input of the example's valid steps, 0 after them) and ``alpha_k ~ U(0, 1)``
  (one per sample, shared by source and prefix), drawn from a generator seeded by (target
  seed, global example index) in that order (alphas, source noise, prefix noise) so that they
  do not depend on batching and the source draws are the same with or without the prefix
  (:func:`shap_draws`); attribution ``mean_k df/dx(b_k + alpha_k (x - b_k)) * (x - b_k)``.
  The draws serve every step of an example, so one forward pass per sample serves all steps.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence

import torch
from captum.attr import DeepLift
from torch import nn

from attnaudit.attribution.captum_internals import deeplift_rule_types
from attnaudit.attribution.inputs import EmbeddedInputs, EmbeddingPasses
from attnaudit.interventions.runner import seeded_generator

SHAP_SALT = 5


class StepOutputs(nn.Module):
    """The attributed outputs (R, w) of a forward pass as a module holding the model, so that
    Captum's DeepLift finds (and hooks) the model's nonlinearity modules."""

    def __init__(self, model: nn.Module, outputs: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.model = model
        self._outputs = outputs

    def forward(self, *embedded: torch.Tensor) -> torch.Tensor:
        """(R, n, d) embedded source (and (R, T, d) decoder inputs) -> (R, w) outputs."""
        return self._outputs(*embedded)


def rule_modules(model: nn.Module) -> tuple[str, ...]:
    """The type names of ``model``'s modules at which Captum's DeepLift applies its rules."""
    rule_types = deeplift_rule_types()
    return tuple(sorted({type(m).__name__ for m in model.modules() if type(m) in rule_types}))


Vectors = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]


def deeplift_vectors(passes: EmbeddingPasses, inputs: EmbeddedInputs, per_pass: int
                     ) -> Iterator[Vectors]:
    """Captum DeepLift attributions (for a model with rule modules): yields ``(rows (R,),
    source vectors (R, w, n, d), prefix vectors (R, w, T, d) or None)`` a chunk of examples at
    a time (the chunk's input and baseline rows share a pass)."""
    width = inputs.emitted.shape[1]
    sides = inputs.sides()
    for rows in torch.arange(len(passes.batch)).split(max(per_pass // 2, 1)):
        both = rows.repeat(2)  # Captum runs the inputs, then the baselines, in one batch

        def outputs(source: torch.Tensor, prefix: torch.Tensor | None = None, *,
                    both: torch.Tensor = both) -> torch.Tensor:
            return passes.outputs(both, inputs.emitted, inputs.contrast, source, prefix)[0]

        explainer = DeepLift(StepOutputs(passes.target.model, outputs))
        xs = tuple(x[rows] for x, _ in sides)
        bases = tuple(base[rows] for _, base in sides)
        vectors = [torch.zeros(len(rows), width, *x.shape[1:], dtype=torch.float32,
                               device=x.device) for x in xs]
        with torch.enable_grad(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Setting forward, backward hooks")
            for step in range(width):
                leaves = tuple(x.detach().clone().requires_grad_() for x in xs)
                found = explainer.attribute(leaves, baselines=bases, target=step)
                for into, side in zip(vectors, found, strict=True):
                    into[:, step] = side.detach().float()
        yield rows, vectors[0], vectors[1] if len(vectors) > 1 else None


def shap_draws(generator: torch.Generator, sides: Sequence[tuple[torch.Tensor, torch.Tensor]],
               n_samples: int, stdev: float) -> tuple[list[torch.Tensor], torch.Tensor]:
    """One example's GradientShap draws, in this order: ``alpha`` (K,) ~ U(0, 1), then for each
    side ``(base (L, d), real (L,) bool)`` (the source, then the prefix) the baselines
    (K, L, d) = ``base`` + ``stdev`` x standard normal noise at the ``real`` positions.
    Returns (the baselines of each side, ``alpha``)."""
    alphas = torch.rand(n_samples, generator=generator)
    starts = []
    for base, real in sides:
        noise = torch.zeros(n_samples, *base.shape)
        noise[:, real.cpu()] = torch.randn(n_samples, int(real.sum()), base.shape[-1],
                                           generator=generator)
        starts.append(base + stdev * noise.to(base.device, base.dtype))
    return starts, alphas


def gradient_shap_vectors(passes: EmbeddingPasses, inputs: EmbeddedInputs, per_pass: int,
                          n_samples: int, stdev: float, seed: int, first_example: int
                          ) -> Iterator[Vectors]:
    """GradientShap attributions: yields ``(rows (R,), source vectors (R, w, n, d), prefix
    vectors (R, w, T, d) or None)`` a chunk of examples at a time, each with all its samples
    (split when they exceed a pass)."""
    width = inputs.emitted.shape[1]
    sides = inputs.sides()
    # noise at real source tokens and at the decoder inputs of valid steps: per example,
    # whatever the batch's padding and width
    real = (passes.batch.source_mask, passes.target.step_mask(inputs.emitted))[: len(sides)]
    samples_per_pass = min(n_samples, per_pass)
    for chunk in torch.arange(len(passes.batch)).split(max(per_pass // n_samples, 1)):
        draws = [shap_draws(seeded_generator(seed, first_example + int(e), 0, SHAP_SALT),
                            [(base[e], mask[e]) for (_, base), mask in zip(sides, real,
                                                                             strict=True)],
                            n_samples, stdev) for e in chunk]
        starts = [torch.stack(side) for side in zip(*(s for s, _ in draws), strict=True)]
        alphas = torch.stack([a for _, a in draws])  # (C, K)
        totals = [torch.zeros(len(chunk), width, *x.shape[1:], dtype=torch.float32,
                              device=x.device) for x, _ in sides]
        for at in range(0, n_samples, samples_per_pass):
            start = [s[:, at : at + samples_per_pass] for s in starts]  # each (C, k, L, d)
            alpha = alphas[:, at : at + samples_per_pass].to(start[0].device, start[0].dtype)
            diffs = [x[chunk, None] - s for (x, _), s in zip(sides, start, strict=True)]
            path = [(s + alpha[..., None, None] * d).flatten(0, 1)
                    for s, d in zip(start, diffs, strict=True)]
            rows = chunk.repeat_interleave(alpha.shape[1])
            for step, grads in passes.gradients(rows, inputs, path[0],
                                                path[1] if len(path) > 1 else None, False):
                for total, grad, d in zip(totals, grads, diffs, strict=False):
                    total[:, step] += (grad.unflatten(0, d.shape[:2]).float()
                                       * d.float()).sum(1)
        yield chunk, totals[0] / n_samples, totals[1] / n_samples if len(totals) > 1 else None
