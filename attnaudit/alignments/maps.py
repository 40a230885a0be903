"""Importance maps (B, L, T, S) of every measure an alignment can be read from.

B examples, L layers, T steps (query rows: step t), S source positions; float32 on the
CPU, larger = more. The measures:

- ``weights``: the cross-attention weights of every cross-attention site, averaged over
  its heads; one layer per site, in the order the model calls them (a decoder-only
  target's ``:cross`` views: continuation rows over the prompt);
- the gradient methods of :func:`attnaudit.attribution.methods.attribute` (``saliency``,
  ``input_x_gradient``, ``integrated_gradients``, ...): their ``importance``, ``|score|``
  normalised over the eligible keys of each step; one layer (they attribute the output
  to the input embedding);
- ``loo``: input leave-one-out (:func:`attnaudit.attribution.loo.leave_one_out`); one layer;
- the contribution measures of :func:`attnaudit.contributions.measure_maps`
  (``value_norm``, ``alti``, ``rollout``, ``value_zeroing``): one layer per decoder layer,
  read after it; a decoder-only model's maps are cut to the prompt keys. A target they
  cannot be computed for (no values or output projection at its sites, e.g. additive
  attention) raises :class:`~attnaudit.errors.ContributionError` naming the sites.

:func:`layer_map` picks one layer or combines them (``"mean"``: the mean over layers).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attnaudit.attribution.loo import leave_one_out
from attnaudit.attribution.methods import attribute
from attnaudit.attribution.options import ALL_METHODS, AttributionOptions
from attnaudit.capturing.recorder import capture
from attnaudit.contributions import ALL_MEASURES as CONTRIBUTION_MEASURES
from attnaudit.contributions import measure_maps
from attnaudit.errors import AlignmentError
from attnaudit.targets.contract import Batch, Seq2SeqTarget

WEIGHTS, LOO = "weights", "loo"
CONTRIBUTIONS = tuple(m for m in CONTRIBUTION_MEASURES if m != WEIGHTS)
MEASURES = (WEIGHTS, *CONTRIBUTIONS, *ALL_METHODS, LOO)
COMBINED = "mean"


def check_measures(measures: Sequence[str]) -> tuple[str, ...]:
    """The measures, checked against :data:`MEASURES` (AlignmentError on an unknown one)."""
    unknown = [m for m in measures if m not in MEASURES]
    if unknown or not measures:
        raise AlignmentError(f"unknown measure(s) {unknown}; choose among "
                             f"{', '.join(MEASURES)}")
    return tuple(dict.fromkeys(measures))


def cross_weights(target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor) -> torch.Tensor:
    """(B, L, T, S) the teacher-forced cross-attention weights, mean over heads, one layer
    per cross-attention site."""
    with torch.no_grad(), capture(target.model, sites=target.sites, kinds=target.kinds) as cap:
        target.teacher_forced(batch, emitted)
    expected = (emitted.shape[0], emitted.shape[1], batch.source_ids.shape[1])
    layers = []
    for name, record in cap.records.items():
        w = record.weights
        if record.kind != "cross":
            continue
        if (w.shape[0], w.shape[2], w.shape[3]) != expected:
            raise AlignmentError(f"site {name!r} has weights {tuple(w.shape)}; an alignment "
                                 f"needs one row per step over the source keys {expected}")
        layers.append(w.float().mean(1).cpu())
    if not layers:
        raise AlignmentError("the target has no cross-attention site to read weights from; "
                             "declare kinds with Seq2SeqTarget(kinds={...})")
    return torch.stack(layers, 1)


def alignment_maps(target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor,
                   measures: Sequence[str] = (WEIGHTS,),
                   attribution: AttributionOptions | None = None,
                   max_memory: int | str | None = None) -> dict[str, torch.Tensor]:
    """Measure name -> (B, L, T, S) float32 map of ``batch`` with greedy output ``emitted``.

    attribution: the gradient methods' options (output, reduction, baseline, detached
    attention); default :class:`~attnaudit.attribution.options.AttributionOptions`.
    """
    measures = check_measures(measures)
    options = attribution or AttributionOptions()
    out: dict[str, torch.Tensor] = {}
    if WEIGHTS in measures:
        out[WEIGHTS] = cross_weights(target, batch, emitted)
    methods = [m for m in measures if m in ALL_METHODS]
    if methods:
        found = attribute(target, batch, emitted, methods, output=options.output,
                          reduction=options.reduction, baseline=options.baseline,
                          detach_attention=options.detach_attention,
                          contrast=options.contrast_ids(batch, emitted, target.eos_id),
                          max_memory=max_memory)
        out.update({m: found.importance[m].float().cpu()[:, None] for m in methods})
    contributions = [m for m in measures if m in CONTRIBUTIONS]
    if contributions:
        n_keys = batch.source_ids.shape[1]  # a decoder-only model's maps go on to the prefix
        out.update({m: found[..., :n_keys].float().cpu() for m, found in
                    measure_maps(target, batch, emitted, contributions).items()})
    if LOO in measures:
        out[LOO] = leave_one_out(target, batch, emitted, max_memory=max_memory)[:, None].float()
    return {m: out[m] for m in measures}


def layer_map(maps: torch.Tensor, layer: int | str = COMBINED) -> torch.Tensor:
    """(B, T, S) of ``maps`` (B, L, T, S): layer ``layer`` (0-based; negative counts from
    the last) or, for ``"mean"``, the mean over layers."""
    if layer == COMBINED:
        return maps.mean(1)
    n_layers = maps.shape[1]
    if isinstance(layer, bool) or not isinstance(layer, int) or not -n_layers <= layer < n_layers:
        raise AlignmentError(f"layer must be {COMBINED!r} or an index among the measure's "
                             f"{n_layers} layer(s), got {layer!r}")
    return maps[:, layer]
