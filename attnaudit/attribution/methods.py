"""Gradient attributions of each emitted token to the source tokens (and the output prefix).

For every example ``b`` and target step ``t`` within the step mask, the attributed output is
chosen by ``output`` (default ``prob``, the teacher-forced probability
``p(emitted[b, t] | y_<t, x)``; also ``logprob``, ``logit``, ``entropy`` (of the whole
output distribution at the step, whichever token was emitted), and against a contrast token
``c_t``: ``contrast`` = ``p(y_t) - p(c_t)`` and ``contrast_logit`` = ``logit(y_t) -
logit(c_t)``, both after the emitted prefix). The attributed input is the output of the
**first call** of ``target.source_embedding`` in the forward pass, ``(n, d)`` per example; a
forward hook replaces that call's output with the tensor being varied, and later calls of
the module (a decoder sharing the embedding, as BART does) run unchanged, so the gradient
reaches the source only through the encoder's call (Captum issues #904 and #1110 show what
goes wrong when a shared embedding is hooked at every call). This is the same computation
as Captum's ``LayerIntegratedGradients`` (and ``LayerGradientXActivation``) on the encoder's
embedding call. With ``target_side`` the decoder's input embeddings (``target.target_embedding``:
the start token, then the emitted tokens before ``t``) are attributed too: position ``j`` of
step ``t``'s prefix is decoder input ``j``, ``j <= t``.

Methods (docs/metrics.md, "Attribution and agreement"); ``e`` is the embedding, ``g`` the
gradient of the attributed output with respect to it, per token:

- ``saliency``: Captum ``Saliency`` (raw gradient); token score ``||g||_2`` over the
  embedding dimension.
- ``input_x_gradient``: Captum ``InputXGradient``; token score ``sum_d g_d * e_d`` (signed,
  ``reduction="sum"``) or ``||g * e||_2`` (``reduction="norm"``, inseq's default).
  ``|score|`` normalised is the Jain & Wallace gradient importance.
- ``integrated_gradients``: Captum ``IntegratedGradients``, Gauss-Legendre with ``n_steps``
  = 50 points, baseline = the embedding of one token at every position (``baseline="pad"``,
  default, or an id; ``"unk"`` as inseq: everywhere but the end-of-sequence token, which
  is kept); token score = the attribution summed over ``d`` (signed; then scores sum to
  ``f(x) - f(baseline)`` up to the reported convergence delta) or its L2 norm
  (``reduction="norm"``).
- ``occlusion``: Captum ``Occlusion`` with a one-token window: token score = ``f(x) -
  f(x with that token's embedding replaced by the baseline token's)``, no gradient (not in
  the suite's default methods: one forward pass per source token).
- ``deeplift`` and ``gradient_shap`` (not in the suite's default methods): Captum's
  ``DeepLift`` (rescale rule where the model has nonlinearity modules Captum supports, else
  ``(x - baseline) * gradient`` from the shared forward pass, at the cost of input x
  gradient) and ``GradientShap`` (a Gaussian baseline distribution around the same
  baseline, seeded per example); :mod:`attnaudit.attribution.reference_methods` says how;
  token score reduced over ``d`` as for integrated gradients.

Every method but occlusion also scores the output prefix with ``target_side``, the prefix
embeddings measured against the same baseline token's embedding.

Variant: by default ``saliency`` and ``input_x_gradient`` hold cross-attention weights
constant (Jain & Wallace's gradient importance); integrated gradients differentiates through
everything, since completeness holds only along one function's path. ``detach_attention``
changes which methods are detached; :meth:`Attributions.variant` says it in words. How the
passes are shared across steps, and what that costs: docs/interventions.md, "Attributions".

Where they live: the method names, :class:`AttributionOptions` and the result
:class:`Attributions` in :mod:`attnaudit.attribution.options`; the embedded inputs, their
baselines and the shared passes in :mod:`attnaudit.attribution.inputs`; saliency, input x
gradient, integrated gradients and occlusion in :mod:`attnaudit.attribution.gradient_methods`;
DeepLift and GradientShap in :mod:`attnaudit.attribution.reference_methods`. This module runs
the methods asked for over one batch (:func:`attribute`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass

import torch

from attnaudit.attribution.gradient_methods import (
    gradient_scores,
    integrated_gradients,
    occlusion_scores,
)
from attnaudit.attribution.inputs import (
    EmbeddedInputs,
    EmbeddingPasses,
    embedded_inputs,
    resolve_baseline_id,
)
from attnaudit.attribution.options import (
    ALL_METHODS,
    DETACHABLE,
    DETACHED_BY_DEFAULT,
    GRADIENT_METHODS,
    INTEGRATION_POINTS,
    METHODS,
    PREFIX_METHODS,
    SHAP_SAMPLES,
    SHAP_STDEV,
    VECTOR_METHODS,
    Attributions,
)
from attnaudit.attribution.reference_methods import (
    Vectors,
    deeplift_vectors,
    gradient_shap_vectors,
    rule_modules,
)
from attnaudit.attribution.scores import SCORE_REDUCTIONS, normalised_importance, reduced
from attnaudit.attribution.step_gradients import OUTPUTS
from attnaudit.errors import InterventionError
from attnaudit.interventions.memory import whole_passes
from attnaudit.interventions.runner import progress_bar
from attnaudit.targets.contract import Batch, Seq2SeqTarget


def attribute(target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor,
              methods: Sequence[str] = METHODS, *, n_steps: int = INTEGRATION_POINTS,
              internal_batch_size: int | None = None, pad_id: int | None = None,
              baseline: str | int = "pad",
              detach_attention: Collection[str] = DETACHED_BY_DEFAULT, output: str = "prob",
              contrast: torch.Tensor | None = None, reduction: str = "sum",
              target_side: bool = False, max_memory: int | str | None = None,
              shap_samples: int = SHAP_SAMPLES, shap_stdev: float = SHAP_STDEV,
              seed: int | None = None, first_example: int = 0,
              progress: bool = False) -> Attributions:
    """Attribute each emitted token's output to the source tokens (see the module doc).

    Args:
        target: the audit target; its model is run in its current mode and left unchanged.
        batch: B sources. emitted: (B, T) long, the model's greedy output.
        methods: any of ``ALL_METHODS``: ``saliency``, ``input_x_gradient``,
            ``integrated_gradients``, ``occlusion``, ``deeplift``, ``gradient_shap``.
        n_steps: integration points of integrated gradients (Gauss-Legendre).
        internal_batch_size: sequences per forward pass (examples x integration points;
            default: as many as ``max_memory`` holds).
        pad_id: the pad token, when it cannot be told from the batch
            (:func:`~attnaudit.attribution.inputs.resolve_pad_id`).
        baseline: the baseline token of integrated gradients, occlusion, deeplift and
            gradient_shap: ``"pad"``, ``"unk"`` (inseq's: ``<unk>`` everywhere but the
            end-of-sequence token, which is kept) or an id.
        detach_attention: methods whose gradients treat cross-attention weights as
            constants (default: saliency and input_x_gradient, the Jain & Wallace variant).
        output: what is attributed, one of ``OUTPUTS``; ``contrast`` and ``contrast_logit``
            need ``contrast`` (B, T) long, the contrast token at each step.
        reduction: ``sum`` (signed) or ``norm`` (L2) over the embedding dimension, for
            input_x_gradient and integrated_gradients.
        target_side: attribute to the decoder's input tokens as well (needs
            ``target.target_embedding``); fills ``Attributions.prefix_scores`` for the
            methods of ``PREFIX_METHODS``.
        max_memory: the budget of one pass (bytes or "2GiB").
        shap_samples, shap_stdev: gradient_shap's baselines per example and the standard
            deviation of their Gaussian noise (embedding units).
        seed, first_example: gradient_shap's draws are seeded by (``seed``, default
            ``target.seed``; ``first_example`` + the example's index in the batch).
        progress: show a progress bar over the examples (one tick per example and pass kind).
    """
    methods = _check_methods(methods, detach_attention)
    _check_options(batch, emitted, contrast, output, reduction, n_steps, internal_batch_size,
                   shap_samples, shap_stdev)
    baseline_id = resolve_baseline_id(target, batch, baseline, pad_id)
    steps = target.step_mask(emitted)
    # steps after every example's end are not run at all
    width = int(steps.any(0).nonzero().max()) + 1 if steps.any() else 1
    passes = EmbeddingPasses(target, batch, output, target_side)
    inputs = embedded_inputs(passes, emitted[:, :width],
                             None if contrast is None else contrast[:, :width], baseline_id,
                             baseline == "unk")
    per_pass = internal_batch_size or whole_passes(
        target, vocab=inputs.vocab, keys=batch.source_ids.shape[1], steps=width, grad=True,
        max_memory=max_memory)
    plan = _Plan(methods, tuple(m for m in methods if m in detach_attention),
                 rule_modules(target.model) if "deeplift" in methods else (), reduction,
                 n_steps, shap_samples, shap_stdev, target.seed if seed is None else seed,
                 first_example)
    scores, prefix, delta = _run(plan, passes, inputs, per_pass, steps, progress)
    keys = target.explain_keys(batch).cpu()
    valid = steps[:, :, None] & keys[:, None, :]
    return Attributions(
        importance={m: normalised_importance(scores[m], valid) for m in methods},
        token_scores=scores,
        convergence_delta=delta, keys=keys, steps=steps, detached=plan.detached, n_steps=n_steps,
        baseline_id=baseline_id, eos_kept=baseline == "unk", output=output,
        reduction=reduction, prefix_scores=prefix, prefix_start=target.first_prefix_input,
        shap_samples=shap_samples, shap_stdev=shap_stdev, rule_modules=plan.rules)


@dataclass(frozen=True)
class _Plan:
    """The passes one call of :func:`attribute` runs: the methods, those with cross-attention
    detached, the model's DeepLift rule modules (empty: DeepLift from the gradient at the
    input), the reduction over the embedding dimension, integrated gradients' points and
    gradient_shap's draws (samples, noise standard deviation, seed, first example index)."""

    methods: tuple[str, ...]
    detached: tuple[str, ...]
    rules: tuple[str, ...]
    reduction: str
    n_steps: int
    shap_samples: int
    shap_stdev: float
    seed: int
    first_example: int

    @property
    def at_input(self) -> tuple[str, ...]:
        """The methods read off the gradient at the input itself: saliency, input x gradient
        and, without rule modules, DeepLift ((x - baseline) x the gradient at x)."""
        return (*GRADIENT_METHODS, *(() if self.rules else ("deeplift",)))

    def detach_groups(self) -> dict[bool, list[str]]:
        """The methods run of :attr:`at_input`, by detachment (one gradient serves a group)."""
        groups: dict[bool, list[str]] = {}
        for method in (m for m in self.methods if m in self.at_input):
            groups.setdefault(method in self.detached, []).append(method)
        return groups

    def pass_kinds(self) -> int:
        """The kinds of pass over every example (one progress tick per example each)."""
        return (len(self.detach_groups()) + ("integrated_gradients" in self.methods)
                + sum(m in self.methods and m not in self.at_input for m in VECTOR_METHODS))


def _run(plan: _Plan, passes: EmbeddingPasses, inputs: EmbeddedInputs, per_pass: int,
         steps: torch.Tensor, progress: bool
         ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None,
                    torch.Tensor | None]:
    """Every method's token scores: source (method -> (B, T, n)), prefix (method -> (B, T, T);
    None without target-side attribution) and integrated gradients' convergence delta (B, T)
    (None when it was not run), 0 outside ``steps`` (B, T) bool, the step mask. Only the
    ``w`` steps ``inputs`` holds are run (up to the last valid step of any example)."""
    n_examples, width = inputs.emitted.shape
    scores = {m: torch.zeros(n_examples, width, inputs.source.shape[1]) for m in plan.methods}
    prefix = ({m: torch.zeros(n_examples, width, width) for m in plan.methods
               if m in PREFIX_METHODS} if inputs.prefix is not None else None)
    delta = None
    with progress_bar(n_examples * plan.pass_kinds(), "attribution", progress) as bar:
        if "occlusion" in plan.methods:
            occlusion_scores(passes, inputs, per_pass, scores["occlusion"], bar)
        if "deeplift" in plan.methods and plan.rules:
            _fill("deeplift", deeplift_vectors(passes, inputs, per_pass), plan.reduction,
                  scores, prefix, bar)
        if "gradient_shap" in plan.methods:
            _fill("gradient_shap",
                  gradient_shap_vectors(passes, inputs, per_pass, plan.shap_samples,
                                        plan.shap_stdev, plan.seed, plan.first_example),
                  plan.reduction, scores, prefix, bar)
        for detach, group in plan.detach_groups().items():
            gradient_scores(passes, inputs, per_pass, group, detach, plan.reduction, scores,
                            prefix, bar)
        if "integrated_gradients" in plan.methods:
            delta = integrated_gradients(passes, inputs, per_pass, plan.n_steps,
                                         "integrated_gradients" in plan.detached,
                                         plan.reduction, scores, prefix, bar)
    n_target, mask = steps.shape[1], steps[:, :width, None]
    scores = {m: _widen(s * mask, n_target) for m, s in scores.items()}
    if prefix is not None:
        prefix = {m: _widen(_widen(s * mask, n_target).transpose(1, 2), n_target)
                  .transpose(1, 2) for m, s in prefix.items()}
    return scores, prefix, None if delta is None else _widen(delta * mask[..., 0], n_target)


def _widen(values: torch.Tensor, width: int) -> torch.Tensor:
    """(B, w, ...) -> (B, width, ...), zeros after ``w``."""
    out = values.new_zeros(values.shape[0], width, *values.shape[2:])
    out[:, : values.shape[1]] = values
    return out


def _fill(method: str, vectors: Iterator[Vectors], reduction: str,
          scores: dict[str, torch.Tensor], prefix: dict[str, torch.Tensor] | None,
          bar: object) -> None:
    """Token scores of ``method`` into ``scores`` (B, w, n) (and ``prefix`` (B, w, w)) from
    ``(rows, source vectors (R, w, n, d), prefix vectors (R, w, w, d) or None)`` chunks."""
    for rows, source, at_prefix in vectors:
        scores[method][rows] = reduced(source, reduction).cpu()
        if prefix is not None and at_prefix is not None:
            prefix[method][rows] = reduced(at_prefix, reduction).cpu()
        bar.update(len(rows))  # type: ignore[attr-defined]


def _check_methods(methods: Sequence[str], detach_attention: Collection[str]) -> tuple[str, ...]:
    methods = tuple(methods)
    unknown = [m for m in methods if m not in ALL_METHODS]
    unknown += [m for m in detach_attention if m not in DETACHABLE]
    if unknown or not methods:
        raise InterventionError(f"attribution methods must be among {ALL_METHODS}, and those "
                                f"holding attention constant among {DETACHABLE}; got "
                                f"{unknown or 'none'}")
    if len(set(methods)) != len(methods):
        raise InterventionError(f"attribution methods repeat: {methods}")
    return methods


def _check_options(batch: Batch, emitted: torch.Tensor, contrast: torch.Tensor | None,
                   output: str, reduction: str, n_steps: int, internal_batch_size: int | None,
                   shap_samples: int, shap_stdev: float) -> None:
    _check_ids("emitted", batch, emitted)
    if contrast is not None:
        _check_ids("contrast", batch, contrast, emitted.shape[1])
    if output not in OUTPUTS:
        raise InterventionError(f"output must be one of {OUTPUTS}, got {output!r}")
    if output.startswith("contrast") != (contrast is not None):
        raise InterventionError(f"output {output!r} needs contrast ids" if contrast is None
                                else f"contrast ids were given but output is {output!r}; use "
                              "output='contrast' or 'contrast_logit'")
    if reduction not in SCORE_REDUCTIONS:
        raise InterventionError(f"reduction must be one of {SCORE_REDUCTIONS}, got {reduction!r}")
    if n_steps < 1 or shap_samples < 1 or (internal_batch_size is not None
                                            and internal_batch_size < 1):
        raise InterventionError(f"n_steps, shap_samples and internal_batch_size must be "
                                f"positive, got {n_steps}, {shap_samples}, "
                                f"{internal_batch_size}")
    if not shap_stdev >= 0:
        raise InterventionError(f"shap_stdev must be >= 0, got {shap_stdev}")


def _check_ids(name: str, batch: Batch, ids: torch.Tensor, width: int | None = None) -> None:
    if (ids.ndim != 2 or ids.shape[0] != len(batch) or ids.dtype != torch.long
            or (width is not None and ids.shape[1] != width)):
        raise InterventionError(f"{name} must be long ids (B={len(batch)}, "
                                f"{'T' if width is None else width}), got {ids.dtype} "
                                f"{tuple(ids.shape)}")

