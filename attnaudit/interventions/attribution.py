"""Gradient attributions of each emitted token to the source tokens (Captum).

For every example ``b`` and target step ``t`` within the step mask, the attributed output is
the teacher-forced probability ``p(emitted[b, t] | y_<t, x)`` (softmax of the logits at step
``t``) and the attributed input is the output of the **first call** of
``target.source_embedding`` in the forward pass, ``(n, d)`` per example. A forward hook
replaces that call's output with the tensor Captum varies; later calls of the same module
(a decoder sharing the embedding, as BART does) run unchanged, so the gradient reaches the
source only through the encoder's call (Captum issues #904 and #1110 show what goes wrong
when a shared embedding is hooked at every call). Attributing at that call this way is the
same computation as Captum's ``LayerIntegratedGradients`` (and ``LayerGradientXActivation``)
on the encoder's embedding call.

Methods (docs/metrics.md, "Attribution and agreement"); ``e`` is the embedding, ``g`` the
gradient of the attributed probability with respect to it, per source token:

- ``saliency``: Captum ``Saliency`` (raw gradient); token score ``||g||_2`` over the
  embedding dimension.
- ``input_x_gradient``: Captum ``InputXGradient``; token score ``sum_d g_d * e_d`` (signed).
  ``|score|`` normalised is the Jain & Wallace gradient importance.
- ``integrated_gradients``: Captum ``IntegratedGradients``, ``method="gausslegendre"``,
  ``n_steps`` = 50, baseline = the pad token's embedding at every source position; token
  score = sum over ``d`` of the attribution (signed), so scores sum to
  ``p(x) - p(baseline)`` up to the reported convergence delta.

Variant reported: by default ``saliency`` and ``input_x_gradient`` treat cross-attention
weights as constants ("attention detached", as Jain & Wallace compute gradient importance):
a capture edit returns ``weights.detach()`` at every cross-attention site, so gradients reach
the source only through the values (encoder states) the attention reads. Integrated
gradients differentiates through everything, because completeness (and so the convergence
delta) holds only for the gradient of one function along the path. ``detach_attention``
changes which methods are detached.

Speed: (example, step) pairs are grouped by step ``t``; each group is one folded batch
(examples repeated with :meth:`Batch.select`) whose emitted ids are cut after step ``t``, so
a step-2 pair does not pay for later decoder steps, and Captum folds the integration points
into the batch as well (``internal_batch_size`` sequences per forward pass).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import pandas as pd
import torch
from captum.attr import InputXGradient, IntegratedGradients, Saliency
from torch import nn

from attnaudit.capturing.recorder import capture
from attnaudit.interventions.runner import InterventionError, progress_bar
from attnaudit.record import Site
from attnaudit.target import Batch, Seq2SeqTarget

METHODS = ("saliency", "input_x_gradient", "integrated_gradients")
DETACHED_BY_DEFAULT = ("saliency", "input_x_gradient")
IG_METHOD = "gausslegendre"
# Sequences per forward + backward pass. On CPU the date LSTM's backward is memory-bound:
# 512 ran about twice as fast per sequence as 4096, and no slower than 160.
ATTRIBUTION_CHUNK = 512
NOT_CALLED = ("target.source_embedding was not called in the forward pass; it must be the "
              "module that embeds the source tokens")


@dataclass
class Attributions:
    """Attributions of every valid (example, step) to the source positions.

    importance: method -> (B, T, n) float, ``|token score|`` normalised to sum 1 over the
        eligible keys at each valid step (all zero when every score is zero); 0 on
        ineligible keys and on steps outside the step mask. This is what agreement ranks.
    token_scores: method -> (B, T, n) float, the per-token scores before normalisation
        (saliency: L2 norm of the gradient; input_x_gradient and integrated_gradients:
        signed sum over the embedding dimension), every source position, 0 outside the
        step mask.
    convergence_delta: (B, T) float, integrated gradients' completeness error
        ``sum_n score - (p(x) - p(baseline))`` in probability units, 0 outside the step
        mask; None when integrated gradients was not run.
    keys: (B, n) bool, eligible keys (``target.explain_keys``).
    steps: (B, T) bool, valid steps (``target.step_mask``).
    detached: methods computed with cross-attention weights detached.
    n_steps: integration points of integrated gradients.
    pad_id: the token whose embedding is the integrated-gradients baseline.
    """

    importance: dict[str, torch.Tensor]
    token_scores: dict[str, torch.Tensor]
    convergence_delta: torch.Tensor | None
    keys: torch.Tensor
    steps: torch.Tensor
    detached: tuple[str, ...]
    n_steps: int
    pad_id: int

    def to_frame(self) -> pd.DataFrame:
        """One row per method x example x valid step x eligible key:
        ``method, example, step, key, importance, token_score, attention_detached``."""
        valid = self.steps[:, :, None] & self.keys[:, None, :]
        example, step, key = valid.nonzero(as_tuple=True)
        frames = [
            pd.DataFrame({
                "method": method,
                "example": example.numpy(),
                "step": step.numpy(),
                "key": key.numpy(),
                "importance": self.importance[method][valid].numpy(),
                "token_score": self.token_scores[method][valid].numpy(),
                "attention_detached": method in self.detached,
            })
            for method in self.importance
        ]
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


@contextmanager
def first_call_replaced(module: nn.Module, value: torch.Tensor) -> Iterator[None]:
    """While active, the first call of ``module`` in each forward pass returns ``value``.

    The context is entered once per forward pass; later calls of the module (a decoder
    sharing the encoder's embedding) are left alone. Raises if the module is never called
    or its output does not have ``value``'s shape.
    """
    calls = 0

    def hook(_module: nn.Module, _args: object, output: torch.Tensor) -> torch.Tensor | None:
        nonlocal calls
        calls += 1
        if calls > 1:
            return None
        if not isinstance(output, torch.Tensor) or output.shape != value.shape:
            shape = tuple(output.shape) if isinstance(output, torch.Tensor) else type(output)
            raise InterventionError(
                f"the source embedding's first call returned {shape}, expected "
                f"{tuple(value.shape)} (batch, source positions, embedding dim)")
        return value

    handle = module.register_forward_hook(hook)
    try:
        yield
        if calls == 0:
            raise InterventionError(NOT_CALLED)
    finally:
        handle.remove()


def source_embeddings(target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor,
                      pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first-call output of the source embedding (B, n, d) and the pad baseline (B, n, d).

    The input is recorded from a real (one-step) forward pass, so whatever the module does
    (scaling, as BART's scaled word embedding does) is included; the baseline is the module
    applied to a pad id at every source position.
    """
    module = _embedding_module(target)
    seen: list[torch.Tensor] = []

    def record(_module: nn.Module, _args: object, output: torch.Tensor) -> None:
        if not seen:
            seen.append(output.detach() if isinstance(output, torch.Tensor) else output)

    handle = module.register_forward_hook(record)
    try:
        with torch.no_grad():
            target.teacher_forced(batch, emitted[:, :1])
    finally:
        handle.remove()
    if not seen:
        raise InterventionError(NOT_CALLED)
    expected = tuple(batch.source_ids.shape)
    if not isinstance(seen[0], torch.Tensor) or tuple(seen[0].shape[:2]) != expected:
        got = tuple(seen[0].shape) if isinstance(seen[0], torch.Tensor) else type(seen[0])
        raise InterventionError(
            f"the source embedding's first call gave {got}; attribution needs one vector per "
            f"source position, shape {expected} + (d,)")
    with torch.no_grad():
        baseline = module(torch.full_like(batch.source_ids, pad_id))
    if baseline.shape != seen[0].shape:
        raise InterventionError(f"the pad baseline has shape {tuple(baseline.shape)}, the "
                                f"embedded source {tuple(seen[0].shape)}")
    return seen[0], baseline


def _embedding_module(target: Seq2SeqTarget) -> nn.Module:
    if not isinstance(target.source_embedding, nn.Module):
        raise InterventionError(f"target {target.name!r} declares no source_embedding module; "
                                "attribution and leave-one-out need it")
    return target.source_embedding


def _detach_cross(site: Site, weights: torch.Tensor,
                  key_mask: torch.Tensor | None) -> torch.Tensor | None:
    return weights.detach() if site.kind == "cross" else None


class StepProbability:
    """Captum forward function: embedded sources (k * N, n, d) -> p(emitted[i, t]) (k * N,).

    Row ``r`` of the input belongs to example ``r % N`` of ``batch`` (Captum tiles the
    integration points along the batch axis). ``step`` is ``t``; ``emitted`` (N, >= t + 1).
    With ``detach_attention`` every cross-attention weight is detached in the pass.
    """

    def __init__(self, target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor, step: int,
                 detach_attention: bool) -> None:
        self.target = target
        self.batch = batch
        self.emitted = emitted[:, : step + 1]
        self.step = step
        self.detach_attention = detach_attention

    def __call__(self, embedded: torch.Tensor) -> torch.Tensor:
        rows = torch.arange(embedded.shape[0]) % len(self.batch)
        batch, emitted = self.batch.select(rows), self.emitted[rows]
        with first_call_replaced(_embedding_module(self.target), embedded):
            if self.detach_attention:
                logits = self._detached_run(batch, emitted)
            else:
                logits = self.target.teacher_forced(batch, emitted)
        probs = torch.softmax(logits[:, self.step].float(), dim=-1)
        return probs.gather(-1, emitted[:, self.step, None]).squeeze(-1)

    def _detached_run(self, batch: Batch, emitted: torch.Tensor) -> torch.Tensor:
        target = self.target
        with capture(target.model, sites=target.sites, edit=_detach_cross,
                     kinds=target.kinds) as cap:
            logits = target.teacher_forced(batch, emitted)
        if not any(rec.kind == "cross" for rec in cap.records.values()):
            raise InterventionError(
                f"detaching attention needs a cross-attention site; sites and kinds seen: "
                f"{ {n: r.kind for n, r in cap.records.items()} }. Declare kinds with "
                "Seq2SeqTarget(kinds={...}) or pass detach_attention=()")
        return logits


def _token_scores(method: str, forward: StepProbability, inputs: torch.Tensor,
                  baseline: torch.Tensor, n_steps: int,
                  internal_batch_size: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token scores (N, n) for one method, and IG's convergence delta (N,) (else None)."""
    if method != "integrated_gradients":
        inputs = inputs.clone().requires_grad_()  # Captum would set it, with a warning
    if method == "saliency":
        grads = Saliency(forward).attribute(inputs, abs=False)
        return grads.flatten(2).norm(dim=-1), None
    if method == "input_x_gradient":
        return InputXGradient(forward).attribute(inputs).flatten(2).sum(-1), None
    attr, delta = IntegratedGradients(forward).attribute(
        inputs, baselines=baseline, n_steps=n_steps, method=IG_METHOD,
        internal_batch_size=internal_batch_size, return_convergence_delta=True)
    return attr.flatten(2).sum(-1), delta


def _check_methods(methods: Sequence[str], detach_attention: Collection[str]) -> tuple[str, ...]:
    methods = tuple(methods)
    unknown = [m for m in (*methods, *detach_attention) if m not in METHODS]
    if unknown or not methods:
        raise ValueError(f"attribution methods must be among {METHODS}, got {unknown or 'none'}")
    if len(set(methods)) != len(methods):
        raise ValueError(f"attribution methods repeat: {methods}")
    return methods


def _check_emitted(batch: Batch, emitted: torch.Tensor) -> None:
    if emitted.ndim != 2 or emitted.shape[0] != len(batch) or emitted.dtype != torch.long:
        raise ValueError(f"emitted must be long ids (B={len(batch)}, T), got "
                         f"{emitted.dtype} {tuple(emitted.shape)}")


def normalised_importance(scores: torch.Tensor, keys: torch.Tensor,
                          steps: torch.Tensor) -> torch.Tensor:
    """``|scores|`` (B, T, n) restricted to eligible keys (B, n) at valid steps (B, T),
    normalised to sum 1 per (example, step); an all-zero row stays zero."""
    valid = (steps[:, :, None] & keys[:, None, :]).to(scores.dtype)
    mass = scores.abs() * valid
    total = mass.sum(-1, keepdim=True)
    return torch.where(total > 0, mass / total.clamp_min(torch.finfo(mass.dtype).tiny), mass)


def attribute(target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor,
              methods: Sequence[str] = METHODS, *, n_steps: int = 50,
              internal_batch_size: int = ATTRIBUTION_CHUNK, pad_id: int | None = None,
              detach_attention: Collection[str] = DETACHED_BY_DEFAULT,
              progress: bool = False) -> Attributions:
    """Attribute each emitted token's probability to the source tokens (see the module doc).

    Args:
        target: the audit target; its model is run in its current mode and left unchanged.
        batch: B sources. emitted: (B, T) long, the model's greedy output.
        methods: any of ``saliency``, ``input_x_gradient``, ``integrated_gradients``.
        n_steps: integration points of integrated gradients (Gauss-Legendre).
        internal_batch_size: sequences per forward pass (examples x integration points).
        pad_id: baseline token; by default the batch's padding id (:func:`resolve_pad_id`).
        detach_attention: methods whose gradients treat cross-attention weights as
            constants (default: saliency and input_x_gradient, the Jain & Wallace variant).
        progress: show a progress bar over the attributed (example, step) pairs.
    """
    methods = _check_methods(methods, detach_attention)
    _check_emitted(batch, emitted)
    if n_steps < 1 or internal_batch_size < 1:
        raise ValueError(f"n_steps and internal_batch_size must be positive, got {n_steps}, "
                         f"{internal_batch_size}")
    pad = resolve_pad_id(target, batch, pad_id)
    embedded, baseline = source_embeddings(target, batch, emitted, pad)
    steps = target.step_mask(emitted)
    n_examples, n_target = emitted.shape
    shape = (n_examples, n_target, batch.source_ids.shape[1])
    scores = {m: torch.zeros(shape) for m in methods}
    delta = torch.zeros(n_examples, n_target) if "integrated_gradients" in methods else None
    with progress_bar(int(steps.sum()), "attribution", progress) as bar:
        for step in range(n_target):
            rows = steps[:, step].nonzero().squeeze(1)
            for at in range(0, len(rows), internal_batch_size):
                part = rows[at : at + internal_batch_size]
                for method in methods:
                    forward = StepProbability(target, batch.select(part), emitted[part], step,
                                              method in detach_attention)
                    token, step_delta = _token_scores(method, forward, embedded[part],
                                                      baseline[part], n_steps,
                                                      internal_batch_size)
                    scores[method][part, step] = token.detach().float()
                    if delta is not None and step_delta is not None:
                        delta[part, step] = step_delta.detach().float()
                bar.update(len(part))
    keys = target.explain_keys(batch)
    return Attributions(
        importance={m: normalised_importance(scores[m], keys, steps) for m in methods},
        token_scores=scores, convergence_delta=delta, keys=keys, steps=steps,
        detached=tuple(m for m in methods if m in detach_attention), n_steps=n_steps,
        pad_id=pad)
