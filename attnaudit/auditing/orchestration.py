""":func:`audit`: the one orchestration of an audit.

validity audit (capture, analysers, findings) -> intervention suite -> checklist -> tables
and manifest, held by an :class:`~attnaudit.auditing.result.Audit`. The report, the gate,
notebooks and the command line are views of that object.
"""

from __future__ import annotations

import inspect
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd
import torch
from torch import nn

from attnaudit.alignments.gold import checked_gold
from attnaudit.alignments.pharaoh import Alignment
from attnaudit.attribution.options import AttributionOptions
from attnaudit.auditing.intervention_suite import InterventionSuite, run_suite
from attnaudit.auditing.plan import VALIDITY, Plan, expect_plan, plan_audit
from attnaudit.auditing.result import Audit
from attnaudit.checklist import build_checklist
from attnaudit.checklist.contributions import CONTRIBUTION_TABLES
from attnaudit.checklist.explanation import claims_record
from attnaudit.errors import AttnauditError, OptionError, TargetError
from attnaudit.interventions.reference_run import Reference
from attnaudit.interventions.work_budget import budget_record
from attnaudit.options import (
    DEFAULT_EXPLORER_EXAMPLES,
    WORK_BUDGET,
    AttributionSettings,
    AuditOptions,
    setting_names,
)
from attnaudit.report.manifest import build_manifest
from attnaudit.runtime.distributed import Shard, current_shard
from attnaudit.runtime.measurement import least_repeats
from attnaudit.runtime.progress import display, part
from attnaudit.targets.checks import checked_target
from attnaudit.targets.contract import Seq2SeqTarget
from attnaudit.targets.decoding import decoding_record
from attnaudit.targets.hf.loading import from_hf
from attnaudit.targets.placement import placed
from attnaudit.validity.analysers import DEFAULT_MAX_MASKED_MASS, DEFAULT_ROW_SUM_TOLERANCE
from attnaudit.validity.pipeline import run_validity_audit

_T = TypeVar("_T")
# from_hf's keywords a model or folder takes through audit's **hf_options (the others are
# audit's own: the model, data, tokenizer, device and dtype)
FROM_HF_OPTIONS = tuple(name for name in inspect.signature(from_hf).parameters
                        if name not in ("model_or_dir", "data", "tokenizer", "device",
                                        "dtype"))


def audit(target_or_model: Seq2SeqTarget | nn.Module | str | Path,
          data: Any = None, *, tokenizer: Any = None, options: AuditOptions | None = None,
          quick: bool = False, limit: int | None = None, interventions: bool = True,
          checks_only: bool = False, device: str | torch.device | None = None,
          dtype: str | torch.dtype | None = None, max_memory: int | str | None = None,
          max_masked_mass: float = DEFAULT_MAX_MASKED_MASS,
          row_sum_tolerance: float | None = DEFAULT_ROW_SUM_TOLERANCE,
          progress: bool = True, command_line: Sequence[str] | str | None = None,
          process_group: Any = None,
          attribution: AttributionOptions | AttributionSettings | None = None,
          sites: Sequence[str] | None = None, heads: Sequence[int] | None = None,
          sequence_effects: bool = False,
          explorer_examples: int = DEFAULT_EXPLORER_EXAMPLES, gold: str | Path | None = None,
          work_budget: float = WORK_BUDGET, **hf_options: Any) -> Audit:
    """Audit the attention of a seq2seq model: validity, interventions, checklist.

    Every setting is a field of :class:`~attnaudit.options.AuditOptions` (``options``);
    the keywords of the same names set them too (a keyword left at its default leaves
    ``options``' value), as do the flags of ``attnaudit report`` of the same names.

    Args:
        target_or_model: a :class:`~attnaudit.targets.contract.Seq2SeqTarget`; or a loaded Hugging
            Face seq2seq model (with ``tokenizer``) or its folder, with ``data``: both go
            through :func:`attnaudit.from_hf` (``hf_options``: its ``batch_size``,
            ``max_new_tokens``, ``max_source_tokens``, ``name``, ``decoding``,
            ``generation``, ``seed``; or ``options.loading``).
        data: with a model or folder: the sources (see :func:`attnaudit.from_hf`).
        tokenizer: with a loaded model: its tokenizer.
        options: every setting at once (:class:`~attnaudit.options.AuditOptions`).
        quick: skip the adversarial search and integrated gradients; 20 permutations per
            row instead of 100 (``options.mode`` quick).
        limit: audit only the first ``limit`` examples (>= 1).
        interventions: run the intervention and attribution suite (False: validity and
            checklist only; the intervention item is "not recorded").
        checks_only: only what the CI gate judges (``attnaudit check``; ``options.mode``
            checks): capture without scores and values, the masking and numerics analysers,
            no timing, no example maps, no expectations, no interventions and no model hash
            in the manifest. Cheap; its checklist items on distributions and performance
            have little to say.
        device, dtype: run on this device (cpu, cuda, cuda:N, mps) and in this floating
            dtype (float32, bfloat16, float16). A target's model is moved for the audit and
            restored exactly afterwards; a loaded model is left alone and a copy is placed
            (see :func:`attnaudit.from_hf`).
        max_memory: the memory budget (bytes or "2GiB"; default 1 GiB) of the interventions'
            chunks and of a query block of explicitly computed attention.
        max_masked_mass, row_sum_tolerance: the validity tolerances (row_sum_tolerance
            None: per site from the weights' dtype and key count; ``options.tolerances``).
        progress: one progress display on stderr for the whole audit
            (:mod:`attnaudit.runtime.progress`).
        command_line: recorded in the manifest and shown in the report.
        process_group: audit across the processes of this ``torch.distributed`` group
            (default: the initialised default group, if any; see
            :mod:`attnaudit.runtime.distributed`). Each rank audits its share of the batches on
            its own device (``cuda:LOCAL_RANK`` for ``"cuda"``, or for no device under
            nccl) and every rank returns the merged audit (the kept examples' maps
            gathered from every rank); progress is printed by rank 0 only. Every rank must call
            ``audit`` with the same arguments; only one should save the report.
        attribution: what the attribution methods attribute and their variant
            (:class:`~attnaudit.options.AttributionSettings`, the flags' settings, or
            :class:`~attnaudit.attribution.options.AttributionOptions`).
        sites, heads: the sites the interventions edit (default every cross-attention
            site) and the heads edited at each (default all; ``options.edits``).
        sequence_effects: also decode the sources again with the uniform, zeroing and
            median permutation edits held at every step, and report whether the returned
            text changed (:mod:`attnaudit.interventions.sequence`; off by default: one
            decoding per edited row).
        explorer_examples: the first examples whose attention maps are kept for the
            report's attention explorer (>= 1; memory grows with it, not with the data).
        gold: a Pharaoh file of gold alignments, one line per example of the data in token
            units (:mod:`attnaudit.alignments.gold`): the report's alignment error rate
            table (``alignment_aer``) for any target, in place of the target's own
            ``gold_alignments``.
        work_budget: the multiply-adds (parameters x tokens) each of the costliest
            protocols may spend per example before it runs less of its work: integrated
            gradients' points, the adversarial search's steps, leave-one-out's edits, value
            zeroing, the faithfulness rows (:mod:`attnaudit.interventions.work_budget`;
            ``math.inf``: no budget; binds from about 10M parameters on). The plan says what
            it leaves out, the metadata what ran.

    Returns:
        The :class:`~attnaudit.auditing.result.Audit`. The model is left as it was.

    Raises:
        OptionError: a setting has a value it cannot take (a TargetError and a ValueError).
        AlignmentError: the gold file cannot be read or does not pair up with the data
            (its line named).
    """
    options = _options(
        {"quick": quick, "checks_only": checks_only, "limit": limit,
         "interventions": interventions, "device": device, "dtype": dtype,
         "max_memory": max_memory, "max_masked_mass": max_masked_mass,
         "row_sum_tolerance": row_sum_tolerance, "attribution": attribution,
         "sites": sites, "heads": heads, "sequence_effects": sequence_effects,
         "explorer_examples": explorer_examples, "gold": gold, "work_budget": work_budget},
        options)
    shard = current_shard(process_group)
    run = partial(_run, options=options, progress=progress and shard.is_main,
                  command_line=command_line, shard=shard)
    return _on_target(target_or_model, data, tokenizer, options, shard, hf_options, run)


def intervene(target_or_model: Seq2SeqTarget | nn.Module | str | Path,
              data: Any = None, *, tokenizer: Any = None, options: AuditOptions | None = None,
              quick: bool = False, limit: int | None = None,
              sites: Sequence[str] | None = None, heads: Sequence[int] | None = None,
              device: str | torch.device | None = None,
              dtype: str | torch.dtype | None = None, max_memory: int | str | None = None,
              progress: bool = True, process_group: Any = None,
              attribution: AttributionOptions | AttributionSettings | None = None,
              sequence_effects: bool = False, work_budget: float = WORK_BUDGET,
              **hf_options: Any) -> InterventionSuite:
    """The intervention and attribution suite alone, as ``attnaudit intervene`` runs it:
    the same target, settings and process group arguments as :func:`audit` (those of the
    validity audit and the report, the tolerances and ``explorer_examples``, do not apply;
    ``options.gold`` gives the suite its alignment error rate table, as in :func:`audit`).

    Returns:
        The :class:`~attnaudit.auditing.intervention_suite.InterventionSuite`: ``tables``
        (its ``write_csv(folder)`` writes them) and ``metadata``.

    Raises:
        OptionError: a bad setting, or ``options.mode`` checks (which runs no suite).
    """
    options = _options(
        {"quick": quick, "limit": limit, "sites": sites, "heads": heads, "device": device,
         "dtype": dtype, "max_memory": max_memory, "attribution": attribution,
         "sequence_effects": sequence_effects, "work_budget": work_budget}, options)
    if options.checks_only or not options.interventions:
        raise OptionError("intervene runs the intervention suite: give a mode of quick or "
                          "full, with interventions (audit runs the checks alone)")
    shard = current_shard(process_group)
    progress = progress and shard.is_main
    return _on_target(target_or_model, data, tokenizer, options, shard, hf_options,
                      lambda target: _planned_suite(target, options, progress, shard,
                                                    _gold(options, target)))


def plan(target_or_model: Seq2SeqTarget | nn.Module | str | Path, data: Any = None, *,
         tokenizer: Any = None, options: AuditOptions | None = None,
         **settings: Any) -> Plan:
    """What :func:`audit` with the same arguments would run, and an estimate of how long it
    takes (``attnaudit report --dry-run``): the passes and edited items per protocol
    (:mod:`attnaudit.auditing.plan`), at the cost of the first batch's reference run and
    uniform edit, and from :data:`~attnaudit.auditing.plan.PILOT_MIN_EXAMPLES` examples on of
    a pilot run (the plan the audit prints itself). ``settings``: :func:`audit`'s keywords
    of the same names (``quick=True``, ``limit=``, ``checks_only=True`` ...).
    ``print(plan)`` shows it."""
    options = _options(settings, options)
    shard = current_shard(None)

    def planned(target: Seq2SeqTarget) -> Plan:
        target = checked_target(target)
        _gold(options, target)  # a gold file audit refuses before it runs: its plan too
        return plan_audit(target, options, attribution_options(options.attribution))

    return _on_target(target_or_model, data, tokenizer, options, shard, {}, planned)


def _gold(options: AuditOptions, target: Seq2SeqTarget) -> tuple[Alignment, ...] | None:
    """The alignments of ``options.gold``, checked against the audited examples, or None."""
    return None if options.gold is None else checked_gold(options.gold, target, options.limit)


def _options(settings: dict[str, Any], options: AuditOptions | None) -> AuditOptions:
    """``options`` with the keywords ``settings`` (:meth:`AuditOptions.from_settings`), the
    attribution setting's type checked too (the options module cannot see its classes)."""
    options = AuditOptions.from_settings(settings, options)
    attribution_options(options.attribution)
    return options


def attribution_options(settings: AttributionOptions | AttributionSettings | None
                        ) -> AttributionOptions | None:
    """What the suite takes: the flags' :class:`AttributionSettings` as options (the
    variant's reduction, baseline and detached methods); options or None as they are."""
    if settings is None or isinstance(settings, AttributionOptions):
        return settings
    if not isinstance(settings, AttributionSettings):
        raise OptionError(f"attribution must be an attnaudit.options.AttributionSettings, an "
                          f"attnaudit.attribution.options.AttributionOptions or None, got "
                          f"{settings!r}")
    return attribution_of(settings)


def attribution_of(settings: AttributionSettings) -> AttributionOptions:
    """The flags' attribution settings as the options the attribution methods take."""
    return AttributionOptions.variant(settings.attribution_variant, output=settings.attribute,
                                      target_side=settings.target_side,
                                      methods=settings.methods)


def _on_target(target_or_model: Seq2SeqTarget | nn.Module | str | Path, data: Any,
               tokenizer: Any, options: AuditOptions, shard: Shard,
               hf_options: dict[str, Any], run: Callable[[Seq2SeqTarget], _T]) -> _T:
    """``run`` on the target: a ready one placed on the options' device and dtype for the
    call (and restored), or one :func:`attnaudit.from_hf` makes of a model and data."""
    unknown = sorted(set(hf_options) - set(FROM_HF_OPTIONS))
    if unknown:
        raise OptionError(f"unknown keywords {unknown}: neither this call's nor from_hf's "
                          f"({', '.join(FROM_HF_OPTIONS)}); every audit setting "
                          f"({', '.join(setting_names())}) is a field of "
                          "options=AuditOptions(...)")
    device = shard.device(options.device)
    loading = {**options.loading.given(), **hf_options}
    if isinstance(target_or_model, Seq2SeqTarget):
        if data is not None or tokenizer is not None or loading:
            given = [name for name, value in (("data", data), ("tokenizer", tokenizer))
                     if value is not None] + sorted(loading)
            raise TargetError(f"data, tokenizer and from_hf options go with a model or a "
                              f"model folder, not with a Seq2SeqTarget (given: "
                              f"{', '.join(given)})")
        with placed(target_or_model, device, options.dtype) as target:
            return run(target)
    if data is None:
        raise TargetError("auditing a model needs data=: source strings, a TSV path, or a "
                          "pandas column")
    target = from_hf(target_or_model, data, tokenizer=tokenizer, device=device,
                     dtype=options.dtype, **loading)
    return run(target)


def _planned_greedy(plan: Plan | None) -> tuple[torch.Tensor, float] | None:
    """The greedy output of the first batch and its seconds, from the plan's reference run
    (the validity audit's first batch is that batch)."""
    ref = None if plan is None else plan.reference
    if ref is None or ref.greedy_seconds is None:
        return None
    return ref.emitted, ref.greedy_seconds


def _run(target: Seq2SeqTarget, *, options: AuditOptions, progress: bool,
         command_line: Sequence[str] | str | None, shard: Shard) -> Audit:
    started = time.perf_counter()
    target = checked_target(target)  # its data's errors name the target, from here on
    limit, checks_only = options.limit, options.checks_only
    gold = _gold(options, target)
    texts = [text for batch in target.iter_batches(limit) for text in batch.texts]
    suite_runs = options.interventions and not checks_only
    attribution = attribution_options(options.attribution)
    if suite_runs and attribution is not None:
        attribution.check(target)  # asked for explicitly: an error now, not a skipped suite
    plan = plan_audit(target, options, attribution) if progress and suite_runs else None
    if plan is not None:
        print(plan, file=sys.stderr, flush=True)
    with display(len(texts), 1 + suite_runs, enabled=progress, name=f"audit {target.name}"):
        if plan is not None:
            expect_plan(plan)
        first_greedy = _planned_greedy(plan)
        with part(VALIDITY):
            validity = run_validity_audit(target, limit=limit, progress=progress,
                                          keep_example=not checks_only, regions=not checks_only,
                                          timing=not checks_only, checks_only=checks_only,
                                          timing_repeats=least_repeats(options.quick),
                                          max_masked_mass=options.tolerances.max_masked_mass,
                                          row_sum_tolerance=options.tolerances.row_sum_tolerance,
                                          shard=shard, keep_examples=options.explorer_examples,
                                          max_memory=options.max_memory,
                                          first_greedy=first_greedy,
                                          first_plain=None if plan is None or first_greedy
                                          is None else plan.first_plain)
        reference = None if plan is None else plan.reference
        plan = None  # its timed pass's logits are the validity audit's, not kept past it
        if suite_runs:
            suite, reason = _run_suite(target, options, progress, shard, gold, reference)
        else:
            suite = None
            reason = ("the audit ran the gate's checks only" if checks_only else
                      "the intervention suite was not requested (interventions=False)")
    checklist = build_checklist(target.model, validity, suite, suite_reason=reason)
    seeds: dict[str, Any] = {"target": target.seed}
    if suite is not None:
        seeds["interventions"] = suite.metadata["seed"]
    manifest = build_manifest(target.model, target_name=target.name, texts=texts,
                              sites=list(validity.sites["site"]), seeds=seeds,
                              command_line=command_line,
                              options=_manifest_options(options),
                              hash_model=not checks_only)
    manifest["thresholds"] = {"max_masked_mass": validity.max_masked_mass,
                              "row_sum_tolerance": validity.row_sum_tolerance}
    manifest["description"] = target.description
    manifest["decoding"] = {**decoding_record(target.decoding),
                            "cached_steps": validity.cached_decoding.record()}
    manifest["distributed"] = shard.describe()
    manifest["input_rows"] = {"rows": validity.degenerate.rows,
                              "degenerate": dict(validity.degenerate.counts)}
    manifest["interventions"] = (
        {"ran": True, "edited_items": suite.metadata["edited_items"],
         "bootstrap": suite.metadata["bootstrap"]} if suite is not None
        else {"ran": False, "reason": reason})
    manifest["explanation"] = claims_record(checklist.verdicts[1])
    result = Audit(target=target.name, description=target.description,
                   tables={**checklist.all_tables(), **section_tables(suite)},
                   manifest=manifest, validity=validity,
                   suite=suite, suite_reason=reason, checklist=checklist)
    if progress:
        print(f"audit {target.name}: {time.perf_counter() - started:.1f} s in all",
              file=sys.stderr, flush=True)
    return result


def section_tables(suite: InterventionSuite | None) -> dict[str, pd.DataFrame]:
    """The suite's "weights vs contributions" tables (not the intervention item's
    evidence), for the report's section of that name and its CSVs."""
    if suite is None:
        return {}
    return {name: suite.tables[name] for name in CONTRIBUTION_TABLES if name in suite.tables}


def _manifest_options(options: AuditOptions) -> dict[str, Any]:
    """The settings the manifest records: always the mode's ``quick``, ``limit`` and
    ``explorer_examples``; the edits only when given."""
    edits = options.edits
    given: dict[str, Any] = {"sequence_effects": True} if edits.sequence_effects else {}
    given |= {name: list(value) for name, value in (("sites", edits.sites),
                                                     ("heads", edits.heads))
              if value is not None}
    if options.gold is not None:
        given["gold"] = options.gold
    if options.work_budget != WORK_BUDGET:
        given["work_budget"] = budget_record(options.work_budget)
    return {"quick": options.quick, "limit": options.limit,
            "explorer_examples": options.explorer_examples, **given}


def _suite(target: Seq2SeqTarget, options: AuditOptions, progress: bool, shard: Shard,
           gold: Sequence[Alignment] | None = None, first: Reference | None = None
           ) -> InterventionSuite:
    """The intervention suite of ``options`` (its public entry point, run_suite); gold:
    the checked gold file's alignments; first: the first batch's reference run, when the
    plan has run it."""
    edits = options.edits
    return run_suite(target, quick=options.quick, limit=options.limit, progress=progress,
                     sites=edits.sites, heads=edits.heads, max_memory=options.max_memory,
                     shard=shard, attribution=attribution_options(options.attribution),
                     sequence_effects=edits.sequence_effects, gold=gold,
                     first_reference=first, work_budget=options.work_budget)


def _planned_suite(target: Seq2SeqTarget, options: AuditOptions, progress: bool,
                   shard: Shard, gold: Sequence[Alignment] | None) -> InterventionSuite:
    """The suite alone, its plan printed first and followed by the progress display."""
    if not progress:
        return _suite(target, options, progress, shard, gold)
    plan = plan_audit(checked_target(target), options, attribution_options(options.attribution))
    print(plan, file=sys.stderr, flush=True)
    with display(plan.examples, enabled=progress, name=f"interventions {target.name}"):
        expect_plan(plan, suite_only=True)
        return _suite(target, options, progress, shard, gold, plan.reference)


def _run_suite(target: Seq2SeqTarget, options: AuditOptions, progress: bool, shard: Shard,
               gold: Sequence[Alignment] | None, first: Reference | None
               ) -> tuple[InterventionSuite | None, str | None]:
    try:
        return _suite(target, options, progress, shard, gold, first), None
    except AttnauditError as exc:
        if progress:
            print(f"audit {target.name}: interventions not recorded: {exc}", file=sys.stderr)
        return None, f"the intervention suite could not run on this target: {exc}"
