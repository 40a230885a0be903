"""Contribution measures of one batch: value norms, ALTI / ALTI+, rollout, value zeroing,
and :func:`measure_maps`, the per-layer source-side maps every measure gives alike.

:func:`contributions` traces one teacher-forced pass and computes, per site, the output
projection (or why not), the norm-based contributions and the ALTI block contributions with
their exactness checks; :func:`composed` composes a measure's blocks across layers (ALTI+ for
encoder-decoders, ALTI / rollout for decoder-only models).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from attnaudit.contributions.alti import (
    BlockContributions,
    ExactnessCheck,
    alti_block,
    block_of,
    unavailable,
)
from attnaudit.contributions.composition import (
    compose,
    compose_decoder,
    rollout_cross,
    rollout_self,
)
from attnaudit.contributions.projection import Projection, head_vectors, projections_of
from attnaudit.contributions.trace import Trace, trace
from attnaudit.contributions.value_norms import ValueNorms, value_norms
from attnaudit.contributions.values import values_by_role
from attnaudit.contributions.zeroing import ZeroingScores, value_zeroing
from attnaudit.errors import ContributionError
from attnaudit.record import Role
from attnaudit.targets.contract import Batch, Seq2SeqTarget

MEASURES = ("weights", "value_norm", "alti", "rollout")
ALL_MEASURES = (*MEASURES, "alti_layer", "value_zeroing", "value_zeroing_raw")


@dataclass
class Contributions:
    """One batch's contribution measures, per site (by name).

    projections: the output projection, or the reason there is none. value_norms,
    blocks: where they could be computed. checks: each site's ALTI exactness check (a site
    that could not be decomposed fails it, with the reason). reasons: per site, why a
    measure is missing.
    """

    trace: Trace
    projections: dict[str, Projection | str]
    value_norms: dict[str, ValueNorms] = field(default_factory=dict)
    blocks: dict[str, BlockContributions] = field(default_factory=dict)
    checks: list[ExactnessCheck] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)


@dataclass
class Composed:
    """A measure composed across layers, read at the output steps.

    layers: the decoder (or decoder-only) layers, bottom to top. source: (B, L, T, n), the
    share of each source token (a decoder-only model's prompt tokens, P) in step t's
    representation after layer l; prefix: (B, L, T, m), each prefix input's share (seq2seq:
    the start token then ``emitted[:, :-1]``, m = T; decoder-only: the generated tokens fed
    back, m = T - 1). Rows of source and prefix together sum to 1.
    """

    layers: list[str]
    source: torch.Tensor
    prefix: torch.Tensor

    @property
    def source_share(self) -> torch.Tensor:
        """(B, L, T): the total source share of every step after every layer."""
        return self.source.sum(-1)


def _check_emitted(batch: Batch, emitted: object) -> None:
    """Refuse emitted ids that are not (B, T >= 1) integers for this batch."""
    if not isinstance(emitted, torch.Tensor) or emitted.ndim != 2 or emitted.is_floating_point() \
            or emitted.shape[0] != len(batch) or emitted.shape[1] < 1:
        shape = tuple(emitted.shape) if isinstance(emitted, torch.Tensor) else type(emitted)
        raise ContributionError(f"emitted must be integer ids of shape ({len(batch)}, T >= 1) "
                                f"for this batch (target.greedy(batch)); got {shape}")


def contributions(target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor, *,
                  projections: Mapping[str, nn.Module] | None = None,
                  alti: bool = True) -> Contributions:
    """Trace one teacher-forced pass of ``emitted`` (B, T) and compute value norms and (with
    ``alti``) the ALTI blocks with their exactness checks, per site.

    projections: output projections declared by site name (with or without ``:kind``), for
    models whose projection is not found by role (:mod:`attnaudit.contributions.projection`).
    """
    _check_emitted(batch, emitted)
    traced = trace(target, batch, emitted)
    for site in traced.sites.values():
        if site.values is None and site.calls == 1:  # a softmax path: find them by role
            found = values_by_role(site)
            if found is not None:
                site.values, site.values_from = found
                site.value_reason = ""
    result = Contributions(traced, projections_of(traced.sites, projections))
    for name, site in traced.sites.items():
        projection = result.projections[name]
        if isinstance(projection, str):
            result.reasons[name] = projection
            if alti:
                result.checks.append(unavailable(name, projection))
            continue
        vectors = head_vectors(site, projection)
        result.value_norms[name] = value_norms(site, vectors)
        if not alti:
            continue
        block = block_of(site, projection)
        if isinstance(block, str):
            result.reasons[name] = block
            result.checks.append(unavailable(name, block))
            continue
        done = alti_block(site, vectors, projection.bias, block,
                          traced.query_mask.get(site.role))
        result.blocks[name] = done
        result.checks.append(done.check)
    return result


def sites_by_role(traced: Trace, role: Role) -> list[str]:
    return [name for name, site in traced.sites.items() if site.role == role]


def _need(result: Contributions, names: Sequence[str], have: Mapping[str, object],
          what: str) -> None:
    """Raise a ContributionError saying, in words, which sites lack ``what`` and why (sites
    that share a reason named together)."""
    by_reason: dict[str, list[str]] = {}
    for name in names:
        if name not in have:
            by_reason.setdefault(result.reasons.get(name, "not computed"), []).append(name)
    if by_reason:
        raise ContributionError("; ".join(
            f"no {what} at {', '.join(sites)}, because {why}"
            for why, sites in by_reason.items()))


def _check_square(traced: Trace, names: Sequence[str]) -> None:
    """Refuse self-attention sites whose query rows and keys are not the sequence's positions,
    one row per key (a site run several times in one pass stacks its rows, as HRM's
    recurrent modules do; memory slots add keys), which no chain of per-layer blocks over
    the positions composes."""
    positions = int(traced.query_mask[Role.SELF].shape[1]) if Role.SELF in traced.query_mask \
        else None
    odd = [f"{n} ({traced.sites[n].weights.shape[-2]} query rows, "
           f"{traced.sites[n].weights.shape[-1]} keys)" for n in names
           if traced.sites[n].weights.shape[-1] != traced.sites[n].weights.shape[-2]
           or (positions is not None and traced.sites[n].weights.shape[-1] != positions)]
    if odd:
        raise ContributionError(
            "composition needs every self-attention site to map the sequence's positions "
            f"onto themselves, one query row per key; these do not: {'; '.join(odd)}")


def composed(result: Contributions, blocks: Callable[[str], torch.Tensor]) -> Composed:
    """A measure's blocks (``blocks(site)``: (B, Q, K) for self-attention, (B, T, n + 1)
    for cross-attention) composed across layers and read at the output steps."""
    traced = result.trace
    steps = int(traced.emitted.shape[1])
    if traced.causal:
        names = sites_by_role(traced, Role.SELF)
        _check_square(traced, names)
        full = compose([blocks(n) for n in names])
        rows = [r[:, traced.prompt - 1 : traced.prompt - 1 + steps] for r in full]
        stacked = torch.stack(rows, dim=1)
        return Composed([traced.sites[n].layer for n in names], stacked[..., : traced.prompt],
                        stacked[..., traced.prompt:])
    encoder = compose([blocks(n) for n in sites_by_role(traced, Role.ENCODER_SELF)])
    selfs, crosses = (sites_by_role(traced, Role.DECODER_SELF),
                      sites_by_role(traced, Role.CROSS))
    if not encoder or len(selfs) != len(crosses) or any(
            traced.sites[s].layer != traced.sites[c].layer for s, c in zip(selfs, crosses,
                                                                           strict=False)):
        raise ContributionError(
            "composition needs encoder self-attention and, in every decoder layer, one self- "
            f"and one cross-attention site; found {', '.join(traced.sites)}")
    layers = compose_decoder([blocks(n) for n in selfs], [blocks(n) for n in crosses],
                             encoder[-1])
    stacked = torch.stack(layers, dim=1)
    n = int(traced.batch.source_ids.shape[1])
    return Composed([traced.sites[c].layer for c in crosses], stacked[..., :n],
                    stacked[..., n:])


def alti_plus(result: Contributions) -> Composed:
    """ALTI composed across layers (ALTI+ for an encoder-decoder)."""
    _need(result, list(result.trace.sites), result.blocks, "ALTI decomposition")
    return composed(result, lambda name: result.blocks[name].contributions)


def rollout(result: Contributions) -> Composed:
    """Attention rollout composed across layers (cross-attention as in ALTI+)."""
    sites = result.trace.sites
    return composed(result, lambda name: rollout_cross(sites[name].weights)
                    if sites[name].role == Role.CROSS else rollout_self(sites[name].weights))


def _reading_sites(traced: Trace) -> list[str]:
    return sites_by_role(traced, traced.reading_role)


def _steps(traced: Trace, per_site: torch.Tensor) -> torch.Tensor:
    """A reading site's (B, Q, K) map at the output steps: decoder-only rows P-1.. ."""
    steps = int(traced.emitted.shape[1])
    if traced.causal:
        return per_site[:, traced.prompt - 1 : traced.prompt - 1 + steps]
    if per_site.shape[1] != steps:
        raise ContributionError(
            f"a cross-attention site has {per_site.shape[1]} query rows "
            f"for {steps} steps (e.g. ProphetNet's n-gram streams), so its rows are not one "
            "per step; per-step maps are not defined for it")
    return per_site


def measure_maps(target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor,
                 measures: Sequence[str] = MEASURES, *,
                 projections: Mapping[str, nn.Module] | None = None
                 ) -> dict[str, torch.Tensor]:
    """Source-side scores of every measure, per layer, for one batch.

    Contract: ``emitted`` (B, T) long is the decoded output the protocols teacher-force
    (``target.greedy(batch)``: start token excluded, EOS included, padding after it); each
    returned map is float32 of shape (B, L, T, S) = (examples, layers, target steps, source
    keys), row t scoring the keys for the step that *emits* ``emitted[:, t]``. Keys are
    ``batch.source_ids`` positions for an encoder-decoder and the prompt + prefix tokens
    (``cat(source_ids, emitted[:, :-1])``, S = P + T - 1) for a decoder-only model. Layers
    are the decoder layers bottom to top, each read after that layer; L = 1 for a measure
    without a per-layer reading (none so far). Rows of padding steps and padded keys are
    left as computed (weights give padded keys 0); mask with ``target.step_mask(emitted)``
    and ``batch.source_mask``.

    Measures (``ALL_MEASURES``):
        weights: the reading sites' attention, head mean (cross-attention; decoder-only:
            the raw self-attention over all earlier positions).
        value_norm: ‖Σ_h a^h_tj f_h(x_j)‖ at the same sites (Kobayashi et al. 2020), in
            hidden-state units.
        alti: ALTI+ composed through layer l (Ferrando et al. 2022b): each source key's
            share, through the encoder, in step t's representation; decoder-only: ALTI
            composed over prompt and prefix. Rows sum to the source share (seq2seq) or 1.
        rollout: attention rollout composed the same way (Abnar & Zuidema 2020).
        alti_layer: layer l's own ALTI block at the reading site, not composed: each
            source key's share of the cross-attention block's output (the rest is the
            decoder stream's residual); decoder-only: the self-attention block's.
        value_zeroing: cosine distance of layer l's output at step t when key j's value is
            zeroed at that layer's reading site, normalised to sum to 1 over the keys row t
            reads (Mohebbi et al. 2023); K re-runs per site and example, so not in the
            default set.
        value_zeroing_raw: the same distances before the per-row normalisation (computed
            by the same re-runs when both are asked for).

    Raises :class:`~attnaudit.errors.ContributionError` naming the sites and reasons when a
    measure cannot be computed (values not exposed, no output projection, no decomposable
    block). ALTI's exactness checks are in :func:`contributions`' result; a site whose
    decomposition does not re-sum to its real output is warned about, by name.
    """
    maps, reasons = measure_maps_or_reasons(target, batch, emitted, measures,
                                            projections=projections)
    if reasons:
        raise ContributionError("; ".join(f"{m} cannot be computed for {target.name}: {why}"
                                          for m, why in reasons.items()))
    return maps


def measure_maps_or_reasons(target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor,
                            measures: Sequence[str] = MEASURES, *,
                            projections: Mapping[str, nn.Module] | None = None,
                            computed: Contributions | None = None
                            ) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """:func:`measure_maps`, measure by measure from one traced pass: the maps of the measures
    that could be computed, and for each one that could not, why, in words (which sites
    lack what). Raises :class:`~attnaudit.errors.ContributionError` only where no measure
    can be read at all (unknown measures, the pass cannot be traced, no reading site).

    computed: :func:`contributions` of this batch and ``emitted`` already computed (with ALTI
    when an ALTI measure is asked for), read in place of a new trace."""
    unknown = [m for m in measures if m not in ALL_MEASURES]
    if unknown:
        raise ContributionError(f"unknown measures {unknown}; known: {list(ALL_MEASURES)}")
    alti = bool({"alti", "alti_layer"} & set(measures))
    result = computed if computed is not None else contributions(
        target, batch, emitted, projections=projections, alti=alti)
    traced = result.trace
    reading = _reading_sites(traced)
    if not reading:
        raise ContributionError(
            f"{target.name}: no {traced.reading_role}-attention site reads the source "
            f"(sites found: {', '.join(traced.sites) or 'none'}), so there is no per-step map")
    maps: dict[str, torch.Tensor] = {}
    reasons: dict[str, str] = {}
    zeroed: dict[str, ZeroingScores] = {}  # one set of re-runs serves both zeroing maps
    for measure in measures:
        try:
            maps[measure] = torch.stack(_per_layer(result, measure, reading, zeroed),
                                        dim=1).float()
        except ContributionError as exc:  # this measure only: the others are still read
            reasons[measure] = str(exc)
    failing = [c.site for c in result.checks if c.status != "pass" and c.site in result.blocks]
    if failing and {"alti", "alti_layer"} & set(maps):
        warnings.warn(f"attnaudit: ALTI's decomposition does not re-sum to the real output at "
                      f"{failing} (contributions(...).checks says why); their maps are "
                      "approximate", stacklevel=3)
    return maps, reasons


def _per_layer(result: Contributions, measure: str, reading: list[str],
               zeroed: dict[str, ZeroingScores]) -> list[torch.Tensor]:
    """One measure's (B, T, S) map per layer (:func:`measure_maps`), or ContributionError
    saying why it cannot be computed. zeroed: value zeroing's scores, filled on first use."""
    traced = result.trace
    if measure == "weights":
        return [_steps(traced, traced.sites[n].weights.mean(1)) for n in reading]
    if measure == "value_norm":
        _need(result, reading, result.value_norms, "value norms")
        return [_steps(traced, result.value_norms[n].summed) for n in reading]
    if measure == "alti_layer":
        _need(result, reading, result.blocks, "ALTI decomposition")
        keys = traced.key_ids[traced.reading_role].shape[1]
        return [_steps(traced, result.blocks[n].contributions[..., :keys]) for n in reading]
    if measure in ("alti", "rollout"):
        done = alti_plus(result) if measure == "alti" else rollout(result)
        both = torch.cat([done.source, done.prefix], -1) if traced.causal else done.source
        return list(both.unbind(1))
    if not zeroed:  # value_zeroing(_raw)
        zeroed.update(value_zeroing(traced, reading))
    return [_steps(traced, zeroed[n].raw if measure.endswith("_raw") else zeroed[n].normalised)
            for n in reading]
