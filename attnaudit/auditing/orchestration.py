""":func:`audit`: the one orchestration of an audit.

validity audit (capture, analysers, findings) -> intervention suite -> checklist -> tables
and manifest, held by an :class:`~attnaudit.auditing.result.Audit`. The report, the gate,
notebooks and the command line are views of that object.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from attnaudit.attribution.options import AttributionOptions
from attnaudit.auditing.intervention_suite import InterventionSuite, run_suite
from attnaudit.auditing.result import Audit
from attnaudit.checklist import build_checklist
from attnaudit.checklist.contributions import CONTRIBUTION_TABLES
from attnaudit.errors import AttnauditError, TargetError
from attnaudit.report.explorer import DEFAULT_EXAMPLES as DEFAULT_EXPLORER_EXAMPLES
from attnaudit.report.manifest import build_manifest
from attnaudit.runtime.distributed import Shard, current_shard
from attnaudit.runtime.progress import display
from attnaudit.targets.checks import checked_target
from attnaudit.targets.contract import Seq2SeqTarget
from attnaudit.targets.decoding import decoding_record
from attnaudit.targets.hf.loading import from_hf
from attnaudit.targets.placement import placed
from attnaudit.validity.analysers import DEFAULT_MAX_MASKED_MASS, DEFAULT_ROW_SUM_TOLERANCE
from attnaudit.validity.pipeline import run_validity_audit


def audit(target_or_model: Seq2SeqTarget | nn.Module | str | Path,
          data: Any = None, *, tokenizer: Any = None, quick: bool = False,
          limit: int | None = None, interventions: bool = True, checks_only: bool = False,
          device: str | torch.device | None = None, dtype: str | torch.dtype | None = None,
          max_memory: int | str | None = None,
          max_masked_mass: float = DEFAULT_MAX_MASKED_MASS,
          row_sum_tolerance: float | None = DEFAULT_ROW_SUM_TOLERANCE,
          progress: bool = True, command_line: Sequence[str] | str | None = None,
          process_group: Any = None, attribution: AttributionOptions | None = None,
          sequence_effects: bool = False,
          explorer_examples: int = DEFAULT_EXPLORER_EXAMPLES, **hf_options: Any) -> Audit:
    """Audit the attention of a seq2seq model: validity, interventions, checklist.

    Args:
        target_or_model: a :class:`~attnaudit.targets.contract.Seq2SeqTarget`; or a loaded Hugging
            Face seq2seq model (with ``tokenizer``) or its folder, with ``data``: both go
            through :func:`attnaudit.from_hf` (``hf_options``: its ``batch_size``,
            ``max_new_tokens``, ``max_source_tokens``, ``name``, ``decoding``,
            ``generation``, ``seed``).
        data: with a model or folder: the sources (see :func:`attnaudit.from_hf`).
        tokenizer: with a loaded model: its tokenizer.
        quick: skip the adversarial search and integrated gradients; 20 permutations per
            row instead of 100.
        limit: audit only the first ``limit`` examples (>= 1).
        interventions: run the intervention and attribution suite (False: validity and
            checklist only; the intervention item is "not recorded").
        checks_only: only what the CI gate judges (``attnaudit check``): capture without
            scores and values, the masking and numerics analysers, no timing, no example
            maps, no expectations, no interventions and no model hash in the manifest.
            Cheap; its checklist items on distributions and performance have little to say.
        device, dtype: run on this device (cpu, cuda, cuda:N, mps) and in this floating
            dtype (float32, bfloat16, float16). A target's model is moved for the audit and
            restored exactly afterwards; a loaded model is left alone and a copy is placed
            (see :func:`attnaudit.from_hf`).
        max_memory: the memory budget (bytes or "2GiB"; default 1 GiB) of the interventions'
            chunks and of a query block of explicitly computed attention.
        max_masked_mass, row_sum_tolerance: the validity tolerances (row_sum_tolerance
            None: per site from the weights' dtype and key count).
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
            (:class:`~attnaudit.attribution.options.AttributionOptions`).
        sequence_effects: also decode the sources again with the uniform, zeroing and
            median permutation edits held at every step, and report whether the returned
            text changed (:mod:`attnaudit.interventions.sequence`; off by default: one
            decoding per edited row).
        explorer_examples: the first examples whose attention maps are kept for the
            report's attention explorer (>= 1; memory grows with it, not with the data).

    Returns:
        The :class:`~attnaudit.auditing.result.Audit`. The model is left as it was.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                              or limit < 1):
        raise TargetError(f"limit must be a positive number of examples, got {limit!r}")
    if isinstance(explorer_examples, bool) or not isinstance(explorer_examples, int) \
            or explorer_examples < 1:
        raise TargetError(f"explorer_examples must be a positive number of examples, got "
                          f"{explorer_examples!r}")
    shard = current_shard(process_group)
    device, progress = shard.device(device), progress and shard.is_main
    run = partial(_run, quick=quick, limit=limit, interventions=interventions,
                  checks_only=checks_only, max_memory=max_memory,
                  max_masked_mass=max_masked_mass, row_sum_tolerance=row_sum_tolerance,
                  progress=progress, command_line=command_line, shard=shard,
                  attribution=attribution, sequence_effects=sequence_effects,
                  explorer_examples=explorer_examples)
    if isinstance(target_or_model, Seq2SeqTarget):
        if data is not None or tokenizer is not None or hf_options:
            raise TargetError("data, tokenizer and from_hf options go with a model or a "
                              "model folder, not with a Seq2SeqTarget")
        with placed(target_or_model, device, dtype) as target:
            return run(target)
    if data is None:
        raise TargetError("auditing a model needs data=: source strings, a TSV path, or a "
                          "pandas column")
    target = from_hf(target_or_model, data, tokenizer=tokenizer, device=device, dtype=dtype,
                     **hf_options)
    return run(target)


def _run(target: Seq2SeqTarget, *, quick: bool, limit: int | None, interventions: bool,
         checks_only: bool, max_memory: int | str | None, max_masked_mass: float,
         row_sum_tolerance: float | None, progress: bool,
         command_line: Sequence[str] | str | None, shard: Shard,
         attribution: AttributionOptions | None, sequence_effects: bool,
         explorer_examples: int) -> Audit:
    started = time.perf_counter()
    target = checked_target(target)  # its data's errors name the target, from here on
    texts = [text for batch in target.iter_batches(limit) for text in batch.texts]
    suite_runs = interventions and not checks_only
    if suite_runs and attribution is not None:
        attribution.check(target)  # asked for explicitly: an error now, not a skipped suite
    with display(len(texts), 1 + suite_runs, enabled=progress, name=f"audit {target.name}"):
        validity = run_validity_audit(target, limit=limit, progress=progress,
                                      keep_example=not checks_only, regions=not checks_only,
                                      timing=not checks_only, checks_only=checks_only,
                                      max_masked_mass=max_masked_mass,
                                      row_sum_tolerance=row_sum_tolerance, shard=shard,
                                      keep_examples=explorer_examples,
                                      max_memory=max_memory)
        if suite_runs:
            suite, reason = _run_suite(target, quick, limit, progress, max_memory, shard,
                                       attribution, sequence_effects)
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
                              options={"quick": quick, "limit": limit,
                                       "explorer_examples": explorer_examples,
                                       **({"sequence_effects": True} if sequence_effects
                                          else {})},
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
        {"ran": True, "edited_items": suite.metadata["edited_items"]} if suite is not None
        else {"ran": False, "reason": reason})
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


def _run_suite(target: Seq2SeqTarget, quick: bool, limit: int | None, progress: bool,
               max_memory: int | str | None, shard: Shard,
               attribution: AttributionOptions | None, sequence_effects: bool
               ) -> tuple[InterventionSuite | None, str | None]:
    try:
        return run_suite(target, quick=quick, limit=limit, progress=progress,
                         max_memory=max_memory, shard=shard, attribution=attribution,
                         sequence_effects=sequence_effects), None
    except AttnauditError as exc:
        if progress:
            print(f"audit {target.name}: interventions not recorded: {exc}", file=sys.stderr)
        return None, f"the intervention suite could not run on this target: {exc}"
