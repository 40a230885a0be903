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

Variant reported: by default ``saliency`` and ``input_x_gradient`` treat cross-attention
weights as constants ("attention detached", as Jain & Wallace compute gradient importance):
a capture edit returns ``weights.detach()`` at every cross-attention site, so gradients reach
the source only through the values (encoder states) the attention reads. Integrated
gradients differentiates through everything, because completeness (and so the convergence
delta) holds only for the gradient of one function along the path. ``detach_attention``
changes which methods are detached; :meth:`Attributions.variant` says it in words.

Speed (attnaudit.attribution.step_gradients): all target steps of an example share each
forward pass (one teacher-forced pass per input point over the whole output), and their
gradients come from batched backward passes; saliency, input x gradient and DeepLift
without rule modules share one gradient when their detachment is the same. In those passes
the output projection's backward multiplies only the rows a step reaches
(:mod:`attnaudit.attribution.output_head`), and a decoder-only model computes the logits of
the continuation's positions only.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import pandas as pd
import torch
from captum.attr._utils.approximation_methods import approximation_parameters
from torch import nn

from attnaudit.attribution.output_head import sparse_output_head
from attnaudit.attribution.reference_methods import (
    SHAP_SAMPLES,
    SHAP_STDEV,
    Vectors,
    deeplift_vectors,
    gradient_shap_vectors,
    rule_modules,
)
from attnaudit.attribution.step_gradients import (
    OUTPUT_VARIANTS,
    OUTPUTS,
    EmbeddingCalls,
    attributed_output,
    pass_sequences,
    step_gradients,
)
from attnaudit.capturing.recorder import capture
from attnaudit.errors import InterventionError
from attnaudit.interventions.runner import progress_bar
from attnaudit.record import Site
from attnaudit.targets.contract import Batch, Seq2SeqTarget

METHODS = ("saliency", "input_x_gradient", "integrated_gradients")  # the suite's
ALL_METHODS = (*METHODS, "occlusion", "deeplift", "gradient_shap")
GRADIENT_METHODS = ("saliency", "input_x_gradient")  # the gradient at the input itself
DETACHABLE = (*GRADIENT_METHODS, "integrated_gradients")
VECTOR_METHODS = ("deeplift", "gradient_shap")  # reference_methods: attribution vectors
PREFIX_METHODS = (*DETACHABLE, *VECTOR_METHODS)  # those that attribute to the prefix too
DETACHED_BY_DEFAULT = ("saliency", "input_x_gradient")
REDUCTIONS = ("sum", "norm")
IG_METHOD = "gausslegendre"


@dataclass(frozen=True)
class AttributionOptions:
    """What the suite attributes and how (the arguments of :func:`attribute` of that name).

    output: one of ``OUTPUTS``; the contrast outputs read each batch's contrast output from
    ``batch.inputs["contrast_ids"]`` (B, T') long (``from_hf(..., contrast=...)`` puts it
    there), cut or padded with the end-of-sequence id to the emitted length. reduction:
    ``sum`` or ``norm``; baseline: ``"pad"``, ``"unk"`` or an id; target_side: attribute to
    the output prefix as well; detach_attention: the methods that hold cross-attention
    constant; methods: the attribution methods the suite runs (None: ``METHODS``, less
    integrated gradients in a quick run).
    """

    output: str = "prob"
    reduction: str = "sum"
    baseline: str | int = "pad"
    target_side: bool = False
    detach_attention: tuple[str, ...] = DETACHED_BY_DEFAULT
    methods: tuple[str, ...] | None = None

    @classmethod
    def variant(cls, name: str, output: str = "prob", target_side: bool = False,
                methods: tuple[str, ...] | None = None) -> AttributionOptions:
        """``attnaudit`` (signed sums, pad baseline, attention held constant for saliency and
        input x gradient) or ``inseq`` (inseq's defaults: L2 norm over the embedding
        dimension, ``<unk>`` baseline, gradients through the attention weights)."""
        if name not in ("attnaudit", "inseq"):
            raise ValueError(f"attribution variant must be attnaudit or inseq, got {name!r}")
        if name == "attnaudit":
            return cls(output, target_side=target_side, methods=methods)
        return cls(output, "norm", "unk", target_side, detach_attention=(), methods=methods)

    def check(self, target: Seq2SeqTarget) -> None:
        """Raise InterventionError at once when ``target`` cannot run these options (so that
        an audit fails before its passes, not after): target-side attribution needs
        ``target.target_embedding``."""
        if self.target_side:
            _prefix_module(target)

    def contrast_ids(self, batch: Batch, emitted: torch.Tensor, eos_id: int
                     ) -> torch.Tensor | None:
        """The contrast token at each step (B, T), or None for a non-contrast output."""
        if not self.output.startswith("contrast"):
            return None
        given = batch.inputs.get("contrast_ids")
        if not isinstance(given, torch.Tensor):
            raise InterventionError(f"output {self.output!r} needs a contrast output per "
                                    "source: from_hf(..., contrast=[...]) or --contrast FILE")
        out = torch.full_like(emitted, eos_id)
        width = min(given.shape[1], emitted.shape[1])
        out[:, :width] = given[:, :width].to(emitted.device)
        return out


@dataclass
class Attributions:
    """Attributions of every valid (example, step) to the source positions (and prefix).

    importance: method -> (B, T, n) float, ``|token score|`` normalised to sum 1 over the
        eligible keys at each valid step (all zero when every score is zero); 0 on
        ineligible keys and on steps outside the step mask. This is what agreement ranks.
    token_scores: method -> (B, T, n) float, the per-token scores before normalisation
        (see the module docstring), every source position, 0 outside the step mask.
    convergence_delta: (B, T) float, integrated gradients' completeness error
        ``sum score - (f(x) - f(baseline))`` in units of the attributed output (the sum over
        source and, with target-side attribution, prefix positions), 0 outside the step
        mask; None when integrated gradients was not run.
    keys: (B, n) bool, eligible keys (``target.explain_keys``).
    steps: (B, T) bool, valid steps (``target.step_mask``).
    detached: methods computed with cross-attention weights detached.
    n_steps: integration points of integrated gradients.
    baseline_id: the token whose embedding is the integrated-gradients baseline.
    eos_kept: the baseline keeps the end-of-sequence token where the input has it (the
        ``"unk"`` baseline, as inseq's).
    output: what was attributed (``OUTPUTS``). reduction: over the embedding dimension for
        input_x_gradient and integrated_gradients (``sum`` signed, ``norm`` L2).
    prefix_scores: method -> (B, T, T) float, token scores of decoder input ``j`` (the start
        token, then emitted ``j - 1``) at step ``t``, 0 where ``j > t`` and outside the step
        mask, for the methods of ``PREFIX_METHODS`` run; None without target-side attribution.
    prefix_start: the first decoder input the target scores
        (``Seq2SeqTarget.first_prefix_input``); inputs before it are left out of the prefix
        rows of :meth:`to_frame` and of their normalisation.
    shap_samples, shap_stdev: gradient_shap's baselines per example and noise standard
        deviation. rule_modules: the model's module types at which DeepLift's rules apply.
    """

    importance: dict[str, torch.Tensor]
    token_scores: dict[str, torch.Tensor]
    convergence_delta: torch.Tensor | None
    keys: torch.Tensor
    steps: torch.Tensor
    detached: tuple[str, ...]
    n_steps: int
    baseline_id: int
    eos_kept: bool = False
    output: str = "prob"
    reduction: str = "sum"
    prefix_scores: dict[str, torch.Tensor] | None = None
    prefix_start: int = 0
    shap_samples: int = SHAP_SAMPLES
    shap_stdev: float = SHAP_STDEV
    rule_modules: tuple[str, ...] = ()

    def variant(self, method: str) -> str:
        """The method's variant in words: token score, baseline, attention, output."""
        if method == "occlusion":
            return (f"f(x) - f(x with the token's embedding replaced by token "
                    f"{self.baseline_id}'s), one token at a time, no gradient; attributed: "
                    f"{OUTPUT_VARIANTS[self.output]}")
        baseline = (f"token {self.baseline_id}'s embedding at every position"
                    f"{' but the end-of-sequence token, kept' if self.eos_kept else ''}")
        rules = (f"Captum's rescale rule at the model's {', '.join(self.rule_modules)} modules, "
                 "plain gradients through functional operations" if self.rule_modules else
                 "no nonlinearity module Captum's rules apply to, so (x - baseline) x the "
                 "gradient at x")
        prefix_noise = ("" if self.prefix_scores is None
                        else " and each decoder input of a valid step")
        if method == "saliency":
            score = "L2 norm of the gradient over the embedding dimension"
        else:
            what = {
                "input_x_gradient": "input x gradient",
                "integrated_gradients": f"attribution ({self.n_steps} Gauss-Legendre points, "
                                        f"baseline: {baseline})",
                "deeplift": f"DeepLift attribution (baseline: {baseline}; {rules})",
                "gradient_shap": f"GradientShap attribution (baselines: {baseline} plus "
                                 f"Gaussian noise of standard deviation {self.shap_stdev} at "
                                 f"each source token{prefix_noise}, {self.shap_samples} samples "
                                 "per example seeded from the target seed)",
            }[method]
            score = (f"signed sum of the {what} over the embedding dimension"
                     if self.reduction == "sum"
                     else f"L2 norm of the {what} over the embedding dimension")
        attention = ("cross-attention held constant (detached)" if method in self.detached
                     else "gradient through the attention weights")
        return f"{score}; {attention}; attributed: {OUTPUT_VARIANTS[self.output]}"

    def to_frame(self) -> pd.DataFrame:
        """One row per method x example x valid step x eligible key: ``method, example,
        step, side, key, importance, token_score, attention_detached``. ``side`` is
        ``source`` (key = source position) or, with target-side attribution, ``prefix``
        (key = decoder input position, ``importance`` normalised over the step's prefix)."""
        sides = {"source": (self.steps[:, :, None] & self.keys[:, None, :],
                            self.token_scores, self.importance)}
        if self.prefix_scores is not None:
            width = self.steps.shape[1]
            causal = torch.ones(width, width, dtype=torch.bool).tril()
            causal[:, : self.prefix_start] = False
            prefix_valid = self.steps[:, :, None] & causal
            sides["prefix"] = (prefix_valid, self.prefix_scores,
                               {m: normalised_importance(s, prefix_valid)
                                for m, s in self.prefix_scores.items()})
        frames = []
        for side, (valid, scores, importance) in sides.items():
            example, step, key = valid.nonzero(as_tuple=True)
            frames += [pd.DataFrame({
                "method": method, "example": example.numpy(), "step": step.numpy(),
                "side": side, "key": key.numpy(),
                "importance": importance[method][valid].numpy(),
                "token_score": scores[method][valid].numpy(),
                "attention_detached": method in self.detached,
            }) for method in scores]
        return pd.concat(frames, ignore_index=True)

    def delta_frame(self) -> pd.DataFrame:
        """Integrated gradients' convergence delta per valid (example, step):
        ``example, step, convergence_delta``."""
        if self.convergence_delta is None:
            raise InterventionError("integrated_gradients was not among the methods run")
        example, step = self.steps.nonzero(as_tuple=True)
        return pd.DataFrame({"example": example.numpy(), "step": step.numpy(),
                             "convergence_delta": self.convergence_delta[self.steps].numpy()})


def resolve_pad_id(target: Seq2SeqTarget, batch: Batch, pad_id: int | None = None) -> int:
    """The padding token id: ``pad_id`` when given, else the id found at the batch's padding
    positions, else ``model.config.pad_token_id``, else the target's only special id."""
    if pad_id is not None:
        return int(pad_id)
    at_padding = batch.source_ids[~batch.source_mask].unique()
    if at_padding.numel() == 1:
        return int(at_padding)
    config_pad = getattr(getattr(target.model, "config", None), "pad_token_id", None)
    if at_padding.numel() == 0 and config_pad is not None:
        return int(config_pad)
    if at_padding.numel() == 0 and len(target.special_ids) == 1:
        return int(target.special_ids[0])
    found = at_padding.tolist() if at_padding.numel() else "none"
    raise InterventionError(
        f"cannot tell the padding token of target {target.name!r} (ids at padding positions: "
        f"{found}; special ids: {list(target.special_ids)}); pass pad_id=...")


def normalised_importance(scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``|scores|`` (B, T, n) restricted to ``valid`` (B, T, n) bool (eligible keys at valid
    steps), normalised to sum 1 per (example, step); an all-zero row stays zero."""
    mass = scores.abs() * valid.to(scores.dtype)
    total = mass.sum(-1, keepdim=True)
    return torch.where(total > 0, mass / total.clamp_min(torch.finfo(mass.dtype).tiny), mass)


def resolve_baseline_id(target: Seq2SeqTarget, batch: Batch, baseline: str | int = "pad",
                        pad_id: int | None = None) -> int:
    """The baseline token: the pad id (:func:`resolve_pad_id`) for ``"pad"``, the unknown
    token for ``"unk"`` (``target.unk_id``, else ``model.config.unk_token_id``; inseq's
    default), or an explicit id."""
    if baseline == "pad":
        return resolve_pad_id(target, batch, pad_id)
    if baseline == "unk":
        unk = target.unk_id
        if unk is None:
            unk = getattr(getattr(target.model, "config", None), "unk_token_id", None)
        if unk is None:
            raise InterventionError(f"target {target.name!r} declares no unk_id (nor an "
                                    "unk_token_id in its model config); pass the baseline "
                                    "token id instead")
        return int(unk)
    if isinstance(baseline, bool) or not isinstance(baseline, int) or baseline < 0:
        raise ValueError(f'baseline must be "pad", "unk" or a token id, got {baseline!r}')
    return baseline


def _detach_cross(site: Site, weights: torch.Tensor,
                  key_mask: torch.Tensor | None) -> torch.Tensor | None:
    return weights.detach() if site.kind == "cross" else None


@dataclass
class _Inputs:
    """One batch's embedded inputs and what is attributed.

    source, source_base: (B, n, d) the embedded source and its baseline. prefix,
    prefix_base: (B, T, d) the decoder's input embeddings and their baseline (None without
    target-side attribution). emitted, contrast: (B, T) ids (contrast None unless a contrast
    output). values: (B, T) the attributed output at the input. vocab: the output
    vocabulary size.
    """

    source: torch.Tensor
    source_base: torch.Tensor
    prefix: torch.Tensor | None
    prefix_base: torch.Tensor | None
    emitted: torch.Tensor
    contrast: torch.Tensor | None
    values: torch.Tensor
    vocab: int

    def sides(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The attributed inputs with their baselines: the source, then (with target-side
        attribution) the prefix."""
        sides = [(self.source, self.source_base)]
        if self.prefix is not None and self.prefix_base is not None:
            sides.append((self.prefix, self.prefix_base))
        return sides


class _Passes:
    """Teacher-forced forward passes over the whole output with replaced embeddings, and the
    gradients of every step's attributed output from them."""

    def __init__(self, target: Seq2SeqTarget, batch: Batch, output: str,
                 target_side: bool) -> None:
        self.target, self.batch, self.output = target, batch, output
        self.source_module = _embedding_module(target)
        self.prefix_module = _prefix_module(target) if target_side else None

    def outputs(self, rows: torch.Tensor, emitted: torch.Tensor, contrast: torch.Tensor | None,
                source: torch.Tensor | None = None, prefix: torch.Tensor | None = None,
                detach: bool = False) -> tuple[torch.Tensor, EmbeddingCalls, int]:
        """Attributed outputs (R, T) of examples ``rows`` (R,) with the source (and prefix)
        embeddings replaced when given, the calls seen, and the vocabulary size."""
        calls = EmbeddingCalls(self.source_module, self.prefix_module, source, prefix)
        batch = self.batch.select(rows)
        edit = (capture(self.target.model, sites=self.target.sites, edit=_detach_cross,
                        kinds=self.target.kinds) if detach else nullcontext())
        with edit as cap, calls.active():
            logits = self.target.teacher_forced(batch, emitted[rows])
        if detach and not any(rec.kind == "cross" for rec in cap.records.values()):
            raise InterventionError(
                f"detaching attention needs a cross-attention site; sites and kinds seen: "
                f"{ {n: r.kind for n, r in cap.records.items()} }. Declare kinds with "
                "Seq2SeqTarget(kinds={...}) or pass detach_attention=()")
        picked = attributed_output(logits, emitted[rows], self.output,
                                   None if contrast is None else contrast[rows])
        return picked, calls, int(logits.shape[-1])

    def gradients(self, rows: torch.Tensor, inputs: _Inputs, source: torch.Tensor,
                  prefix: torch.Tensor | None, detach: bool
                  ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor | None]]:
        """Gradients at ``source`` (R, n, d) (and ``prefix`` (R, T, d)) of every step's
        output: yields ``(step, source grads (R, n, d), prefix grads (R, T, d) or None)``."""
        leaves = tuple(x.detach().requires_grad_() for x in (source, prefix) if x is not None)
        with torch.enable_grad():
            with sparse_output_head(self.target.model):
                values, _, _ = self.outputs(rows, inputs.emitted, inputs.contrast, leaves[0],
                                            leaves[1] if len(leaves) > 1 else None, detach)
            for step, grads in step_gradients(values, leaves):
                yield step, grads[0], grads[1] if len(grads) > 1 else None


def _embedding_module(target: Seq2SeqTarget) -> nn.Module:
    if not isinstance(target.source_embedding, nn.Module):
        raise InterventionError(f"target {target.name!r} declares no source_embedding module; "
                                "attribution and leave-one-out need it")
    return target.source_embedding


def _prefix_module(target: Seq2SeqTarget) -> nn.Module:
    if not isinstance(target.target_embedding, nn.Module):
        raise InterventionError(f"target {target.name!r} declares no target_embedding module; "
                                "target-side attribution needs the decoder's input embedding")
    return target.target_embedding


def _embedded_inputs(passes: _Passes, emitted: torch.Tensor, contrast: torch.Tensor | None,
                     baseline_id: int, eos_kept: bool) -> _Inputs:
    """The recorded embeddings of a real forward pass, their baselines, and the attributed
    outputs (no gradients)."""
    batch = passes.batch
    rows = torch.arange(len(batch))
    with torch.no_grad():
        values, calls, vocab = passes.outputs(rows, emitted, contrast)
        source = calls.recorded_source
        expected = tuple(batch.source_ids.shape)
        if not isinstance(source, torch.Tensor) or tuple(source.shape[:2]) != expected:
            got = tuple(source.shape) if isinstance(source, torch.Tensor) else type(source)
            raise InterventionError(
                f"the source embedding's first call gave {got}; attribution needs one vector "
                f"per source position, shape {expected} + (d,)")
        source_base = passes.source_module(_baseline_ids(batch.source_ids, baseline_id,
                                                         passes.target.eos_id, eos_kept))
        if source_base.shape != source.shape:
            raise InterventionError(f"the baseline has shape {tuple(source_base.shape)}, the "
                                    f"embedded source {tuple(source.shape)}")
        prefix = prefix_base = None
        if passes.prefix_module is not None:
            prefix = calls.recorded_prefix
            if prefix is None or prefix.shape[:2] != emitted.shape:
                got = None if prefix is None else tuple(prefix.shape)
                raise InterventionError(f"the target embedding gave {got}; target-side "
                                        f"attribution needs {tuple(emitted.shape)} + (d,)")
            prefix_base = passes.prefix_module(_baseline_ids(emitted, baseline_id,
                                                             passes.target.eos_id, eos_kept))
    return _Inputs(source.detach(), source_base, prefix, prefix_base, emitted, contrast,
                   values.float(), vocab)


def _baseline_ids(ids: torch.Tensor, baseline_id: int, eos_id: int, eos_kept: bool
                  ) -> torch.Tensor:
    """``baseline_id`` at every position of ``ids`` (B, L), or everywhere but the
    end-of-sequence tokens with ``eos_kept``."""
    base = torch.full_like(ids, baseline_id)
    return torch.where(ids == eos_id, ids, base) if eos_kept else base


def _token_score(grads: torch.Tensor, at: torch.Tensor | None, reduction: str) -> torch.Tensor:
    """(R, c, k, d) gradients -> (R, c, k) scores: ``||g||`` (``at`` None, saliency), else
    ``g * at`` reduced over d by ``reduction``; ``at`` (R, k, d) or (R, c, k, d)."""
    if at is None:
        return grads.float().norm(dim=-1)
    return _reduced((grads * (at[:, None] if at.ndim == grads.ndim - 1 else at)).float(),
                    reduction)


def _reduced(vectors: torch.Tensor, reduction: str) -> torch.Tensor:
    """Attribution vectors (..., d) -> token scores (...): signed ``sum`` or L2 ``norm``."""
    return vectors.sum(-1) if reduction == "sum" else vectors.norm(dim=-1)


def _fill(method: str, vectors: Iterator[Vectors], reduction: str,
          scores: dict[str, torch.Tensor], prefix: dict[str, torch.Tensor] | None,
          bar: object) -> None:
    """Token scores of ``method`` into ``scores`` (B, w, n) (and ``prefix`` (B, w, w)) from
    ``(rows, source vectors (R, w, n, d), prefix vectors (R, w, w, d) or None)`` chunks."""
    for rows, source, at_prefix in vectors:
        scores[method][rows] = _reduced(source, reduction).cpu()
        if prefix is not None and at_prefix is not None:
            prefix[method][rows] = _reduced(at_prefix, reduction).cpu()
        bar.update(len(rows))  # type: ignore[attr-defined]


def _check_methods(methods: Sequence[str], detach_attention: Collection[str]) -> tuple[str, ...]:
    methods = tuple(methods)
    unknown = [m for m in methods if m not in ALL_METHODS]
    unknown += [m for m in detach_attention if m not in DETACHABLE]
    if unknown or not methods:
        raise ValueError(f"attribution methods must be among {ALL_METHODS}, and those holding "
                         f"attention constant among {DETACHABLE}; got {unknown or 'none'}")
    if len(set(methods)) != len(methods):
        raise ValueError(f"attribution methods repeat: {methods}")
    return methods


def _check_ids(name: str, batch: Batch, ids: torch.Tensor, width: int | None = None) -> None:
    if (ids.ndim != 2 or ids.shape[0] != len(batch) or ids.dtype != torch.long
            or (width is not None and ids.shape[1] != width)):
        raise ValueError(f"{name} must be long ids (B={len(batch)}, "
                         f"{'T' if width is None else width}), got {ids.dtype} "
                         f"{tuple(ids.shape)}")


def _check_options(output: str, contrast: torch.Tensor | None, reduction: str, n_steps: int,
                   internal_batch_size: int | None, shap_samples: int, shap_stdev: float
                   ) -> None:
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
    if output.startswith("contrast") != (contrast is not None):
        raise ValueError(f"output {output!r} needs contrast ids" if contrast is None
                         else f"contrast ids were given but output is {output!r}; use "
                              "output='contrast' or 'contrast_logit'")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if n_steps < 1 or shap_samples < 1 or (internal_batch_size is not None
                                            and internal_batch_size < 1):
        raise ValueError(f"n_steps, shap_samples and internal_batch_size must be positive, got "
                         f"{n_steps}, {shap_samples}, {internal_batch_size}")
    if not shap_stdev >= 0:
        raise ValueError(f"shap_stdev must be >= 0, got {shap_stdev}")


def attribute(target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor,
              methods: Sequence[str] = METHODS, *, n_steps: int = 50,
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
        pad_id: the pad token, when it cannot be told from the batch (:func:`resolve_pad_id`).
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
    _check_ids("emitted", batch, emitted)
    if contrast is not None:
        _check_ids("contrast", batch, contrast, emitted.shape[1])
    _check_options(output, contrast, reduction, n_steps, internal_batch_size, shap_samples,
                   shap_stdev)
    baseline_id = resolve_baseline_id(target, batch, baseline, pad_id)
    steps = target.step_mask(emitted)
    n_examples, n_target = emitted.shape
    n_keys = batch.source_ids.shape[1]
    # steps after every example's end are not run at all
    width = int(steps.any(0).nonzero().max()) + 1 if steps.any() else 1
    passes = _Passes(target, batch, output, target_side)
    inputs = _embedded_inputs(passes, emitted[:, :width],
                              None if contrast is None else contrast[:, :width], baseline_id,
                              baseline == "unk")
    per_pass = internal_batch_size or pass_sequences(target, vocab=inputs.vocab, keys=n_keys,
                                                     steps=width, max_memory=max_memory)
    scores = {m: torch.zeros(n_examples, width, n_keys) for m in methods}
    prefix = ({m: torch.zeros(n_examples, width, width) for m in methods if m in PREFIX_METHODS}
              if target_side else None)
    rules = rule_modules(target.model) if "deeplift" in methods else ()
    # without rule modules DeepLift is (x - baseline) x the gradient at x: a gradient method
    at_input = (*GRADIENT_METHODS, *(() if rules else ("deeplift",)))
    detach_groups: dict[bool, list[str]] = {}
    for method in (m for m in methods if m in at_input):
        detach_groups.setdefault(method in detach_attention, []).append(method)
    ig = "integrated_gradients" in methods
    delta = None
    kinds = len(detach_groups) + ig + sum(m in methods and m not in at_input
                                          for m in VECTOR_METHODS)
    seed = target.seed if seed is None else seed
    with progress_bar(n_examples * kinds, "attribution", progress) as bar:
        if "occlusion" in methods:
            _occlusion_scores(passes, inputs, per_pass, scores["occlusion"], bar)
        if "deeplift" in methods and rules:
            _fill("deeplift", deeplift_vectors(passes, inputs, per_pass), reduction, scores,
                  prefix, bar)
        if "gradient_shap" in methods:
            _fill("gradient_shap",
                  gradient_shap_vectors(passes, inputs, per_pass, shap_samples, shap_stdev, seed,
                                        first_example), reduction, scores, prefix, bar)
        for detach, group in detach_groups.items():
            _gradient_scores(passes, inputs, per_pass, group, detach, reduction, scores,
                             prefix, bar)
        if ig:
            delta = _integrated_gradients(passes, inputs, per_pass, n_steps,
                                          "integrated_gradients" in detach_attention,
                                          reduction, scores, prefix, bar)
    mask = steps[:, :width, None]
    scores = {m: _widen(s * mask, n_target) for m, s in scores.items()}
    if prefix is not None:
        prefix = {m: _widen(_widen(s * mask, n_target).transpose(1, 2), n_target)
                  .transpose(1, 2) for m, s in prefix.items()}
    keys = target.explain_keys(batch).cpu()
    valid = steps[:, :, None] & keys[:, None, :]
    return Attributions(
        importance={m: normalised_importance(scores[m], valid) for m in methods},
        token_scores=scores,
        convergence_delta=None if delta is None else _widen(delta * steps[:, :width], n_target),
        keys=keys, steps=steps, detached=tuple(m for m in methods if m in detach_attention),
        n_steps=n_steps, baseline_id=baseline_id, eos_kept=baseline == "unk", output=output,
        reduction=reduction, prefix_scores=prefix, prefix_start=target.first_prefix_input,
        shap_samples=shap_samples,
        shap_stdev=shap_stdev, rule_modules=rules)


def _widen(values: torch.Tensor, width: int) -> torch.Tensor:
    """(B, w, ...) -> (B, width, ...), zeros after ``w``."""
    out = values.new_zeros(values.shape[0], width, *values.shape[2:])
    out[:, : values.shape[1]] = values
    return out


def _gradient_scores(passes: _Passes, inputs: _Inputs, per_pass: int, group: list[str],
                     detach: bool, reduction: str, scores: dict[str, torch.Tensor],
                     prefix: dict[str, torch.Tensor] | None, bar: object) -> None:
    """Saliency, input x gradient and DeepLift without rule modules of ``group`` (same
    detachment) from one gradient ``g``: ``||g||``, ``g * x`` and ``g * (x - baseline)``."""
    for rows in torch.arange(len(passes.batch)).split(per_pass):
        sides = [(x[rows], base[rows]) for x, base in inputs.sides()]
        into = [scores, prefix] if prefix is not None else [scores]
        factors = {m: [_gradient_factor(m, x, base) for x, base in sides] for m in group}
        for step, *grads in passes.gradients(rows, inputs, sides[0][0],
                                             sides[1][0] if len(sides) > 1 else None, detach):
            for method in group:
                for out, grad, at in zip(into, grads, factors[method], strict=False):
                    out[method][rows, step] = _token_score(grad, at, reduction).cpu()
        bar.update(len(rows))  # type: ignore[attr-defined]


def _gradient_factor(method: str, x: torch.Tensor, base: torch.Tensor) -> torch.Tensor | None:
    """What the gradient at ``x`` is multiplied by: nothing (saliency), ``x`` (input x
    gradient) or ``x - base`` (DeepLift without rule modules)."""
    if method == "saliency":
        return None
    return x if method == "input_x_gradient" else x - base


def _occlusion_scores(passes: _Passes, inputs: _Inputs, per_pass: int, scores: torch.Tensor,
                      bar: object) -> None:
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


def _integrated_gradients(passes: _Passes, inputs: _Inputs, per_pass: int, n_steps: int,
                          detach: bool, reduction: str, scores: dict[str, torch.Tensor],
                          prefix: dict[str, torch.Tensor] | None, bar: object) -> torch.Tensor:
    """Integrated gradients into ``scores`` (and ``prefix``); returns the convergence delta
    (B, w). Examples are taken a chunk at a time with all their integration points (split
    when one example's points exceed a pass), so the integral (E, w, n, d) stays small."""
    step_sizes, alphas = approximation_parameters(IG_METHOD)
    weights = torch.tensor(step_sizes(n_steps), dtype=torch.float32)
    points = torch.tensor(alphas(n_steps), dtype=torch.float32)
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
            for step, *grads in passes.gradients(rows, inputs, path[0],
                                                 path[1] if len(path) > 1 else None, detach):
                for integral, grad in zip(integrals, grads, strict=False):
                    weighted = grad.float() * row_weight.to(grad.device)[:, None, None]
                    integral[:, step] += weighted.unflatten(0, (len(chunk), len(alpha))).sum(1)
        for side, (integral, d) in enumerate(zip(integrals, diffs, strict=True)):
            into = scores if side == 0 else prefix
            assert into is not None
            into["integrated_gradients"][chunk] = _token_score(integral, d.float(),
                                                               reduction).cpu()
            signed_total[chunk] += _token_score(integral, d.float(), "sum").sum(-1).cpu()
        bar.update(len(chunk))  # type: ignore[attr-defined]
    with torch.no_grad():
        base_values, _, _ = passes.outputs(torch.arange(len(passes.batch)), inputs.emitted,
                                           inputs.contrast, inputs.source_base,
                                           inputs.prefix_base)
    return signed_total - (inputs.values - base_values.float()).cpu()
