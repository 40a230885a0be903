"""What the attribution methods are called, what a run is asked to do
(:class:`AttributionOptions`), and what it gives back (:class:`Attributions`);
:func:`attnaudit.attribution.methods.attribute` runs them."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from attnaudit.attribution.inputs import prefix_embedding_module
from attnaudit.attribution.scores import normalised_importance
from attnaudit.attribution.step_gradients import OUTPUT_VARIANTS
from attnaudit.errors import InterventionError
from attnaudit.targets.contract import Batch, Seq2SeqTarget

METHODS = ("saliency", "input_x_gradient", "integrated_gradients")  # the suite's
QUICK_OMITTED = ("integrated_gradients",)  # the suite's methods a quick run leaves out
ALL_METHODS = (*METHODS, "occlusion", "deeplift", "gradient_shap")
GRADIENT_METHODS = ("saliency", "input_x_gradient")  # the gradient at the input itself
DETACHABLE = (*GRADIENT_METHODS, "integrated_gradients")
VECTOR_METHODS = ("deeplift", "gradient_shap")  # reference_methods: attribution vectors
PREFIX_METHODS = (*DETACHABLE, *VECTOR_METHODS)  # those that attribute to the prefix too
DETACHED_BY_DEFAULT = ("saliency", "input_x_gradient")
INTEGRATION_POINTS = 50  # integrated gradients' Gauss-Legendre points by default
LEAST_INTEGRATION_POINTS = 4  # the fewest the suite runs under its work budget
SHAP_SAMPLES = 8  # gradient_shap's baselines per example
SHAP_STDEV = 0.1  # and the standard deviation of their Gaussian noise (embedding units)


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
            raise InterventionError(f"attribution variant must be attnaudit or inseq, got {name!r}")
        if name == "attnaudit":
            return cls(output, target_side=target_side, methods=methods)
        return cls(output, "norm", "unk", target_side, detach_attention=(), methods=methods)

    def check(self, target: Seq2SeqTarget) -> None:
        """Raise InterventionError at once when ``target`` cannot run these options (so that
        an audit fails before its passes, not after): target-side attribution needs
        ``target.target_embedding``."""
        if self.target_side:
            prefix_embedding_module(target)

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
        (:mod:`attnaudit.attribution.methods` says how each method makes them), every source
        position, 0 outside the step mask.
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
