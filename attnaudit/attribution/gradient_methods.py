"""Saliency, input x gradient, integrated gradients and occlusion from the shared passes.

Each fills token-score tables ``scores`` (method -> (B, w, n)) and, with target-side
attribution, ``prefix`` (method -> (B, w, w)) for the ``w`` steps run, a chunk of examples at a
time; :func:`attnaudit.attribution.methods.attribute` allocates them and says what each method
computes. The gradients come from :meth:`~attnaudit.attribution.inputs.EmbeddingPasses.gradients`
(one forward pass per input point serves every target step); occlusion takes no gradient, only
forward passes of occluded copies.
"""

from __future__ import annotations

import torch

from attnaudit.attribution.captum_internals import integration_points
from attnaudit.attribution.inputs import EmbeddedInputs, EmbeddingPasses
from attnaudit.attribution.scores import token_score

IG_METHOD = "gausslegendre"  # Captum's quadrature for integrated gradients


def gradient_scores(passes: EmbeddingPasses, inputs: EmbeddedInputs, per_pass: int,
                    group: list[str], detach: bool, reduction: str,
                    scores: dict[str, torch.Tensor], prefix: dict[str, torch.Tensor] | None,
                    bar: object) -> None:
    """Saliency, input x gradient and DeepLift without rule modules of ``group`` (same
    detachment) from one gradient ``g``: ``||g||``, ``g * x`` and ``g * (x - baseline)``."""
    for rows in torch.arange(len(passes.batch)).split(per_pass):
        sides = [(x[rows], base[rows]) for x, base in inputs.sides()]
        into = [scores, prefix] if prefix is not None else [scores]
        factors = {m: [_gradient_factor(m, x, base) for x, base in sides] for m in group}
        for step, grads in passes.gradients(rows, inputs, sides[0][0],
                                            sides[1][0] if len(sides) > 1 else None, detach):
            for method in group:
                for out, grad, at in zip(into, grads, factors[method], strict=False):
                    out[method][rows, step] = token_score(grad, at, reduction).cpu()
        bar.update(len(rows))  # type: ignore[attr-defined]


def _gradient_factor(method: str, x: torch.Tensor, base: torch.Tensor) -> torch.Tensor | None:
    """What the gradient at ``x`` is multiplied by: nothing (saliency), ``x`` (input x
    gradient) or ``x - base`` (DeepLift without rule modules)."""
    if method == "saliency":
        return None
    return x if method == "input_x_gradient" else x - base


def occlusion_scores(passes: EmbeddingPasses, inputs: EmbeddedInputs, per_pass: int,
                     scores: torch.Tensor, bar: object) -> None:
    """Occlusion into ``scores`` (B, w, n): ``f(x) - f(x with token i's embedding replaced by
    the baseline's)``; every step of an occluded copy comes from one forward pass, and each
    pass folds ``per_pass`` (example, real source token) copies."""
    example, token = passes.batch.source_mask.cpu().nonzero(as_tuple=True)
    with torch.no_grad():
        for at in range(0, len(example), per_pass):
            rows, keys = example[at : at + per_pass], token[at : at + per_pass]
            occluded = inputs.source[rows].clone()
            occluded[torch.arange(len(rows)), keys] = inputs.source_base[rows, keys]
            values, _, _ = passes.outputs(rows, inputs.emitted, inputs.contrast, occluded)
            scores[rows, :, keys] = (inputs.values[rows] - values.float()).cpu()
    bar.update(len(passes.batch))  # type: ignore[attr-defined]


def integrated_gradients(passes: EmbeddingPasses, inputs: EmbeddedInputs, per_pass: int,
                         n_steps: int, detach: bool, reduction: str,
                         scores: dict[str, torch.Tensor], prefix: dict[str, torch.Tensor] | None,
                         bar: object) -> torch.Tensor:
    """Integrated gradients into ``scores`` (and ``prefix``); returns the convergence delta
    (B, w). Examples are taken a chunk at a time with all their integration points (split
    when one example's points exceed a pass), so the integral (E, w, n, d) stays small."""
    weights, points = integration_points(IG_METHOD, n_steps)
    points_per_pass = min(n_steps, per_pass)
    sides = inputs.sides()
    signed_total = torch.zeros(inputs.values.shape, dtype=torch.float32)
    for chunk in torch.arange(len(passes.batch)).split(max(per_pass // n_steps, 1)):
        diffs = [x[chunk] - base[chunk] for x, base in sides]
        integrals = [torch.zeros(len(chunk), inputs.emitted.shape[1], *x.shape[1:],
                                 dtype=torch.float32, device=x.device) for x, _ in sides]
        for at in range(0, n_steps, points_per_pass):
            alpha, weight = points[at : at + points_per_pass], weights[at : at + points_per_pass]
            rows = chunk.repeat_interleave(len(alpha))
            local = torch.arange(len(chunk)).repeat_interleave(len(alpha))
            scale, row_weight = alpha.repeat(len(chunk)), weight.repeat(len(chunk))
            path = [base[rows] + scale.to(d.device, d.dtype)[:, None, None] * d[local]
                    for (_, base), d in zip(sides, diffs, strict=True)]
            for step, grads in passes.gradients(rows, inputs, path[0],
                                                path[1] if len(path) > 1 else None, detach):
                for integral, grad in zip(integrals, grads, strict=False):
                    weighted = grad.float() * row_weight.to(grad.device)[:, None, None]
                    integral[:, step] += weighted.unflatten(0, (len(chunk), len(alpha))).sum(1)
        for side, (integral, d) in enumerate(zip(integrals, diffs, strict=True)):
            into = scores if side == 0 else prefix
            assert into is not None
            into["integrated_gradients"][chunk] = token_score(integral, d.float(),
                                                              reduction).cpu()
            signed_total[chunk] += token_score(integral, d.float(), "sum").sum(-1).cpu()
        bar.update(len(chunk))  # type: ignore[attr-defined]
    with torch.no_grad():
        base_values, _, _ = passes.outputs(torch.arange(len(passes.batch)), inputs.emitted,
                                           inputs.contrast, inputs.source_base,
                                           inputs.prefix_base)
    return signed_total - (inputs.values - base_values.float()).cpu()
