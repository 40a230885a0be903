"""Weights vs contributions in the intervention suite: every contribution measure beside the
attention weights, the gradients and leave-one-out, per step (docs/metrics.md,
"Weights vs contributions").

Per batch, :func:`add_contribution_parts` computes the contribution measures of
:func:`attnaudit.contributions.measure_maps` read as one key-level map per step, as the
suite's ``attention`` is: ``value_norm`` averaged over the decoder layers (as the weights
are averaged over sites), ``alti`` and ``rollout`` after the last layer (composed through
the whole model), and, unless the audit is quick, ``value_zeroing`` (one re-run per key and
decoder layer) averaged over the decoder layers. It adds their rank agreement with
leave-one-out and with the weights, the top key of every measure per row, the first
example's maps and the sink table of the first batch. :func:`contribution_tables` turns
those into the summary ``weights_vs_contributions``: per measure, the share of rows whose
top key is not the top-weight key, the share whose top key is the top leave-one-out key, and
the mean rank agreement with leave-one-out.

A target with ``gold_alignments``, or an audit given a gold file (``gold=``,
:mod:`attnaudit.alignments.gold`), also gets ``alignment_aer``: the alignment error rate of
every measure's map (token units, both step conventions; :mod:`attnaudit.alignments`).

Each measure is computed on its own: one a target cannot give (additive attention without
values, no output projection, a hybrid layer whose attention is not a residual block) gets
its ``contribution_measures`` row saying why, in words and per site, and no numbers; the
other measures and the rest of the report are written as usual.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict

import pandas as pd
import torch

from attnaudit.alignments.aer import AlignmentCounts, count_links
from attnaudit.alignments.extract import links_from_maps
from attnaudit.alignments.pharaoh import Alignment, parse_line
from attnaudit.alignments.units import CONVENTIONS, batch_units
from attnaudit.analysis.bootstrap import bootstrap_interval
from attnaudit.attribution.agreement import ATTENTION, LOO, agreement, summarise_agreement
from attnaudit.contributions import (
    Contributions,
    contributions,
    measure_maps_or_reasons,
    sink_table,
)
from attnaudit.errors import AttnauditError
from attnaudit.interventions.memory import model_encoder_layers, model_width_and_layers
from attnaudit.interventions.reference_run import Reference
from attnaudit.targets.contract import Batch, DecoderOnlyTarget, Seq2SeqTarget

CONTRIBUTION_MEASURES = ("value_norm", "alti", "rollout")
ZEROING = "value_zeroing"
PER_LAYER = ("value_norm", ZEROING)  # read as the mean over layers, as the weights are
READINGS = {"value_norm": "mean over the decoder layers' attention sites",
            ZEROING: "mean over the decoder layers' attention sites",
            "alti": "ALTI+ composed through every layer (after the last)",
            "rollout": "attention rollout composed through every layer (after the last)"}
EXAMPLE_COLUMNS = ["measure", "step", "target_token", "key", "source_token", "value"]
AER_COLUMNS = ["measure", "convention", "aer", "precision", "recall", "links", "sure",
               "sentences"]
SUMMARY_COLUMNS = ["measure", "reading", "rows", "top_differs_from_weights",
                   "top_differs_from_weights_low", "top_differs_from_weights_high",
                   "top_is_loo_top", "kendall_tau_vs_loo", "top_k_overlap_vs_loo"]
NOT_IN_QUICK = ("not run: a quick audit leaves it out (one re-run per key and decoder layer); "
                "the full report computes it")
_Parts = dict[str, list[pd.DataFrame]]


def _add(parts: _Parts, name: str, frame: pd.DataFrame) -> None:
    parts.setdefault(name, []).append(frame)


def contribution_importances(target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor,
                             measures: tuple[str, ...] = CONTRIBUTION_MEASURES
                             ) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Measure -> (B, T, n) key-level map (module docstring) of the measures that could be
    computed, and measure -> why not (in words) of the others."""
    maps, reasons, _ = traced_importances(target, batch, emitted, measures)
    return maps, reasons


def contribution_terms(target: Seq2SeqTarget, batch: Batch, steps: int) -> int:
    """The numbers of per-key terms ALTI forms on ``batch`` with ``steps`` emitted steps
    (a :class:`~attnaudit.interventions.protocol.Cost`'s ``terms``): query rows x keys x
    model width at every site, for every example. A decoder-only model: each layer's
    self-attention over the prompt and the output before its last step; an encoder-decoder:
    the encoder's self-attention over the source, and each decoder layer's self-attention
    over the output and cross-attention over the source."""
    model, keys = target.model, int(batch.source_ids.shape[1])
    width, layers = model_width_and_layers(model)
    if isinstance(target, DecoderOnlyTarget):
        per_example = layers * (keys + steps - 1) ** 2
    else:
        per_example = (model_encoder_layers(model) * keys * keys
                       + layers * (steps * steps + steps * keys))
    return len(batch) * per_example * width


def traced_importances(target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor,
                       measures: tuple[str, ...]
                       ) -> tuple[dict[str, torch.Tensor], dict[str, str], Contributions | None]:
    """:func:`contribution_importances` and the one traced pass (with ALTI) they are read
    from, which the sink table reads too; None when the pass cannot be traced."""
    try:
        traced = contributions(target, batch, emitted)
        maps, reasons = measure_maps_or_reasons(target, batch, emitted, measures,
                                                computed=traced)
    except AttnauditError as exc:  # no measure can be read: the same reason for each
        return {}, dict.fromkeys(measures, str(exc)), None
    n_keys = batch.source_ids.shape[1]  # a decoder-only model's maps go on to the prefix
    return {m: (found.mean(1) if m in PER_LAYER else found[:, -1])[..., :n_keys].float().cpu()
            for m, found in maps.items()}, reasons, traced


def top_keys(importances: Mapping[str, torch.Tensor], keys: torch.Tensor,
             steps: torch.Tensor) -> pd.DataFrame:
    """Per counted row with an eligible key: ``example, step`` and ``top_<measure>``, the
    eligible key with the largest value (the first on a tie), and ``loo_decided``: whether
    leave-one-out is not constant over the row's eligible keys."""
    eligible = keys.cpu()[:, None, :].expand(-1, steps.shape[1], -1)
    example, step = (steps.cpu() & eligible.any(-1)).nonzero(as_tuple=True)
    frame = {"example": example.numpy(), "step": step.numpy()}
    mask = eligible[example, step]
    for name, values in importances.items():
        row = values.detach().cpu().double()[example, step]
        frame[f"top_{name}"] = row.masked_fill(~mask, -torch.inf).argmax(-1).numpy()
        if name == LOO:
            high = row.masked_fill(~mask, -torch.inf).amax(-1)
            low = row.masked_fill(~mask, torch.inf).amin(-1)
            frame["loo_decided"] = (high > low).numpy()
    return pd.DataFrame(frame)


def _example_frame(target: Seq2SeqTarget, ref: Reference,
                   importances: Mapping[str, torch.Tensor]) -> pd.DataFrame:
    """Example 0's maps over its eligible keys and counted steps, one row per cell."""
    keys = target.explain_keys(ref.batch.select([0]))[0].cpu().nonzero().squeeze(1).tolist()
    steps = ref.steps[0].cpu().nonzero().squeeze(1).tolist()
    sources = target.source_tokens(ref.batch.select([0]))[0]
    outputs = target.target_tokens(ref.emitted[:1])[0]
    rows = [{"measure": name, "step": t, "target_token": str(outputs[t]), "key": k,
             "source_token": str(sources[k]), "value": float(values[0, t, k])}
            for name, values in importances.items() for t in steps for k in keys]
    return pd.DataFrame(rows, columns=EXAMPLE_COLUMNS)


def _name(measure: str) -> str:
    return "weights" if measure == ATTENTION else measure


def batch_gold(target: Seq2SeqTarget, batch: Batch, ref: Reference,
               gold: Sequence[Alignment] | None = None) -> list[Alignment]:
    """The gold alignments of ``batch``: its lines of ``gold`` (one per example of the data,
    the batch's from ``ref.first_example`` on) when given, else the target's
    ``gold_alignments``."""
    if gold is not None:
        return list(gold[ref.first_example:ref.first_example + len(batch)])
    gold_alignments = target.gold_alignments
    assert gold_alignments is not None  # called only for a target that has them
    return [parse_line(line, f"{target.name}: gold alignment of example {i}")
            for i, line in enumerate(gold_alignments(batch, ref.emitted))]


def alignment_counts(target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor,
                     maps: Mapping[str, torch.Tensor], gold: Sequence[Alignment]
                     ) -> pd.DataFrame:
    """Per measure and step convention, the batch's link counts (token units) against
    ``gold``, one alignment per example; maps: measure -> (B, T, n)."""
    rows = []
    for convention in CONVENTIONS:
        units = batch_units(target, batch, emitted, "tokens", convention)
        for name, values in maps.items():
            counts = count_links(links_from_maps(values, units), gold)
            rows.append({"measure": _name(name), "convention": convention, **asdict(counts)})
    return pd.DataFrame(rows)


def _aer_table(counts: pd.DataFrame) -> pd.DataFrame:
    """The summed counts as AER, precision and recall per measure and convention."""
    records = []
    for (measure, convention), group in counts.groupby(["measure", "convention"], sort=False):
        total = AlignmentCounts(*(int(group[c].sum()) for c in (
            "predicted", "sure", "hit_sure", "hit_possible", "sentences")))
        records.append({"measure": measure, "convention": convention, "aer": total.aer,
                        "precision": total.precision, "recall": total.recall,
                        "links": total.predicted, "sure": total.sure,
                        "sentences": total.sentences})
    return pd.DataFrame(records, columns=AER_COLUMNS)


def add_contribution_parts(target: Seq2SeqTarget, batch: Batch, ref: Reference,
                           importances: Mapping[str, torch.Tensor], parts: _Parts, *,
                           zeroing: bool = True, skipped: str = NOT_IN_QUICK,
                           gold: Sequence[Alignment] | None = None
                           ) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The batch's contribution tables, appended to ``parts`` (module docstring); returns
    :func:`contribution_importances` of the measures compared (for later protocols).

    importances: the suite's maps (B, T, n): ``attention``, the gradient methods, ``loo``.
    zeroing: compare value zeroing too (else ``skipped`` says why not). gold: one gold
    alignment per example of the data (a gold file), scored in place of the target's
    ``gold_alignments``.
    """
    measures = CONTRIBUTION_MEASURES + ((ZEROING,) if zeroing else ())
    found, reasons, traced = traced_importances(target, batch, ref.emitted, measures)
    _add(parts, "contribution_measures", pd.DataFrame(
        [{"measure": m, "reading": READINGS[m], "status": "computed" if m in found else
          "not applicable", "reason": reasons.get(m, "")} for m in measures]
        + ([] if zeroing else [{"measure": ZEROING, "reading": READINGS[ZEROING],
                                "status": "not run", "reason": skipped}])))
    every = {**importances, **found}
    keys = target.explain_keys(batch)
    rows = top_keys(every, keys, ref.steps)
    rows["example"] += ref.first_example
    _add(parts, "top_keys", rows)
    if found:
        pairs = [(m, LOO) for m in found] + [(ATTENTION, m) for m in found]
        agree = agreement(every, keys, ref.steps, pairs=pairs)
        agree["example"] += ref.first_example
        _add(parts, "contribution_agreement", agree)
    if gold is not None or target.gold_alignments is not None:
        _add(parts, "alignment_counts", alignment_counts(target, batch, ref.emitted, every,
                                                         batch_gold(target, batch, ref, gold)))
    if ref.first_example == 0:
        _add(parts, "contribution_example", _example_frame(target, ref, every))
        if found and traced is not None:  # the measures ran, so the traced pass did too
            _add(parts, "sinks", sink_table(traced))
    return found, reasons


def contribution_tables(tables: Mapping[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """The summary tables from the assembled per-batch tables (module docstring)."""
    out: dict[str, pd.DataFrame] = {}
    measures = tables["contribution_measures"].drop_duplicates("measure", keep="last")
    out["contribution_measures"] = measures.reset_index(drop=True)
    if "contribution_agreement" in tables:
        out["contribution_agreement_summary"] = summarise_agreement(
            tables["contribution_agreement"])
    mine = out.get("contribution_agreement_summary",
                   tables.get("contribution_agreement_summary"))
    summary = pd.concat([tables["agreement_summary"], *([] if mine is None else [mine])],
                        ignore_index=True)
    rows = tables["top_keys"]
    decided = rows[rows["loo_decided"]] if "loo_decided" in rows else rows.iloc[:0]
    records = []
    for column in rows.columns:
        if not column.startswith("top_") or column == f"top_{LOO}":
            continue
        name = column.removeprefix("top_")
        vs_loo = summary[((summary["method_a"] == name) & (summary["method_b"] == LOO))
                         | ((summary["method_a"] == LOO) & (summary["method_b"] == name))]
        records.append({
            "measure": _name(name),
            "reading": READINGS.get(name, "mean over the cross-attention sites and heads"
                                    if name == ATTENTION else "gradient attribution"),
            "rows": len(rows),
            **bootstrap_interval((rows[column] != rows[f"top_{ATTENTION}"]).to_numpy(),
                                 rows["example"].to_numpy()).columns("top_differs_from_weights"),
            "top_is_loo_top": float((decided[column] == decided[f"top_{LOO}"]).mean())
            if len(decided) else float("nan"),
            "kendall_tau_vs_loo": float(vs_loo["kendall_tau_mean"].iloc[0])
            if len(vs_loo) else float("nan"),
            "top_k_overlap_vs_loo": float(vs_loo["top_k_overlap_mean"].iloc[0])
            if len(vs_loo) else float("nan"),
        })
    out["weights_vs_contributions"] = pd.DataFrame(records, columns=SUMMARY_COLUMNS)
    if "alignment_counts" in tables:  # summed over batches: no row depends on the batching
        counts = tables["alignment_counts"].groupby(["measure", "convention"], sort=False,
                                                    as_index=False).sum(numeric_only=True)
        out["alignment_counts"] = counts
        out["alignment_aer"] = _aer_table(counts)
    return out
