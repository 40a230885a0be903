"""``attnaudit report``: the audit as a self-contained HTML page, CSV tables and a manifest.

:func:`write_report` runs the validity audit and the intervention suite on a target, maps
their results onto the checklist (:mod:`attnaudit.checklist`) and writes

- ``DIR/index.html``: one file, inline CSS, figures as PNG data URIs, no scripts and no
  network access; every user-provided string is escaped;
- ``DIR/<table>.csv``: every table the page shows, whole and tidy;
- ``DIR/manifest.json``: model class, parameter count and content hash, library versions,
  seeds, data digest, sites, command line (see :mod:`attnaudit.report.manifest`).

The intervention suite, when it cannot run on a target (an attnaudit error), or cannot be
imported, is shown as "not recorded" with the reason; nothing is filled in.
This package only presents: every number comes from the audit, the suite or the checklist.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from attnaudit.audit import ValidityAudit, run_validity_audit
from attnaudit.checklist import (
    SMALL_TVD,
    Checklist,
    agreement_summary,
    build_checklist,
    find_table,
)
from attnaudit.errors import AttnauditError
from attnaudit.output_folder import OutputFolder
from attnaudit.report import figures as figs
from attnaudit.report.definitions import definition_blocks
from attnaudit.report.html import write_html
from attnaudit.report.manifest import build_manifest, write_manifest
from attnaudit.report.tables import TableView, csv_name, view, write_csvs
from attnaudit.target import Seq2SeqTarget

__all__ = ["report_command", "write_report"]


def report_command(args: argparse.Namespace) -> int:
    """The ``attnaudit report`` subcommand: load the target, write the report, print its path."""
    from attnaudit.cli import load_cli_target
    from attnaudit.interventions.suite import memory_option

    max_memory = memory_option(args)
    OutputFolder.check(args.out, force=args.force)  # before the target loads
    target = load_cli_target(args)
    path = write_report(target, args.out, quick=args.quick, limit=args.limit, progress=True,
                        command_line=command_line(args), max_memory=max_memory,
                        force=args.force)
    print(f"attnaudit report: wrote {path}")
    return 0


def command_line(args: argparse.Namespace) -> list[str]:
    """The ``attnaudit report`` command that reproduces this run, from parsed arguments."""
    words = ["attnaudit", "report"]
    if args.target is not None:
        words.append(args.target)
    for flag, value in (("--hf", args.hf), ("--data", args.data), ("--limit", args.limit),
                        ("--device", args.device), ("--dtype", args.dtype),
                        ("--batch-size", args.batch_size),
                        ("--max-new-tokens", args.max_new_tokens),
                        ("--max-source-tokens", args.max_source_tokens),
                        ("--max-memory", args.max_memory)):
        if value is not None:
            words += [flag, str(value)]
    words += ["--out", str(args.out)]
    words += [flag for flag, given in (("--quick", args.quick), ("--force", args.force))
              if given]
    return words


def write_report(target: Seq2SeqTarget, out_dir: str | Path, *, quick: bool = False,
                 limit: int | None = None, progress: bool = True,
                 command_line: Sequence[str] | str | None = None,
                 max_memory: int | str | None = None, force: bool = False) -> Path:
    """Audit ``target`` and write the report to ``out_dir``; return the path of index.html.

    Args:
        target: the model and its data; left unchanged.
        out_dir: created if missing; a previous attnaudit output there is replaced whole
            once the new report is complete (:mod:`attnaudit.output_folder`); a folder
            holding other files is refused unless ``force``. Checked before the audit.
        quick: skip the adversarial search and integrated gradients.
        limit: audit only the first ``limit`` examples.
        progress: progress lines on stderr.
        command_line: recorded in the manifest and shown on the page.
        max_memory: the interventions' chunk budget (bytes or "2GiB"; default 1 GiB).
        force: replace ``out_dir`` even when it holds files that are not an attnaudit output.
    """
    folder = OutputFolder.check(out_dir, force=force)
    started = time.perf_counter()
    audit = run_validity_audit(target, limit=limit, progress=progress, keep_example=True)
    suite, suite_reason = _run_suite(target, quick, limit, progress, max_memory)
    checklist = build_checklist(target.model, audit, suite, suite_reason=suite_reason)
    tables = report_tables(checklist)
    texts = [text for batch in target.iter_batches(limit) for text in batch.texts]
    options = {"quick": quick, "limit": limit}
    manifest = build_manifest(
        target.model, target_name=target.name, texts=texts,
        sites=list(audit.sites["site"]),
        seeds={"target": target.seed, **_suite_seeds(suite)},
        command_line=command_line, options=options)
    views = _table_views(checklist)
    context = {
        "target_name": target.name,
        "target_description": target.description,
        "manifest": manifest,
        "options": options,
        "command_text": (command_line if isinstance(command_line, str)
                         else " ".join(command_line or ["(Python API)"])),
        "verdicts": checklist.verdicts,
        "misconceptions": checklist.misconceptions,
        "items": checklist.items,
        "figures": item_figures(audit, checklist),
        "tables": views,
        "all_tables": [v for item_views in views.values() for v in item_views],
        "summary_csvs": [csv_name(name) for name in _summary_tables(checklist)],
        "definitions": definition_blocks(),
    }
    with folder.assembling() as out:
        write_csvs(tables, out)
        write_manifest(manifest, out)
        page = write_html(context, out).name
    if progress:
        print(f"report {target.name}: {time.perf_counter() - started:.1f} s, {folder.path}",
              file=sys.stderr, flush=True)
    return folder.path / page


def _run_suite(target: Seq2SeqTarget, quick: bool, limit: int | None, progress: bool,
               max_memory: int | str | None) -> tuple[Any | None, str | None]:
    try:
        from attnaudit.interventions.suite import run_suite
    except ImportError as exc:
        return None, f"the intervention suite is not available in this installation ({exc})"
    try:
        return run_suite(target, quick=quick, limit=limit, progress=progress,
                         max_memory=max_memory), None
    except AttnauditError as exc:
        if progress:
            print(f"report {target.name}: interventions not recorded: {exc}", file=sys.stderr)
        return None, f"the intervention suite could not run on this target: {exc}"


def _suite_seeds(suite: Any | None) -> dict[str, Any]:
    seed = getattr(suite, "seed", None)
    return {} if seed is None else {"interventions": seed}


def report_tables(checklist: Checklist) -> dict[str, pd.DataFrame]:
    """Every table of the report by name: the checklist's evidence plus its own summaries."""
    return {**_summary_tables(checklist), **checklist.tables()}


def _summary_tables(checklist: Checklist) -> dict[str, pd.DataFrame]:
    verdicts = pd.DataFrame([{"verdict": v.key, "question": v.question, "status": v.status,
                              "answer": v.answer} for v in checklist.verdicts])
    notes = pd.DataFrame([{"misconception": n.claim, "correction": n.correction,
                           "evidence": n.evidence} for n in checklist.misconceptions],
                         columns=["misconception", "correction", "evidence"])
    return {"verdicts": verdicts, "checklist": checklist.summary_frame(),
            "misconceptions": notes}


def _table_views(checklist: Checklist) -> dict[str, list[TableView]]:
    return {item.key: [view(ev.name, ev.title, ev.caption, ev.frame) for ev in item.evidence]
            for item in checklist.items}


def item_figures(audit: ValidityAudit | None, checklist: Checklist) -> dict[str, list[figs.Figure]]:
    """Figures per checklist item key, drawn from the audit and the checklist's evidence."""
    out: dict[str, list[figs.Figure]] = {}
    if audit is not None:
        out["distributions"] = [*_example_heatmaps(audit), *_entropy_figure(checklist)]
        out["eligibility"] = _masked_mass_figure(audit)
    interventions = checklist.item("interventions")
    out["interventions"] = _intervention_figures({ev.name: ev.frame
                                                  for ev in interventions.evidence})
    return out


def _example_heatmaps(audit: ValidityAudit) -> list[figs.Figure]:
    example = audit.example
    if example is None:
        return []
    out = []
    for index, (site, amap) in enumerate(example.maps.items()):
        if 0 in amap.weights.shape:  # an empty output, or no real source token: no map
            continue
        heads = amap.weights.shape[0]
        weights = amap.weights.mean(0) if heads > 1 else amap.weights[0]
        what = f"the mean over {heads} heads" if heads > 1 else "its single head"
        out.append(figs.attention_heatmap(
            f"example_map_{index}", weights, amap.key_labels, amap.query_labels,
            title=f"{site}: first audited example",
            caption=(f"Attention weights at {site} ({amap.role}), {what}, for the source "
                     f"\"{example.source}\". Rows are query positions, columns keys; only "
                     "real tokens and steps up to the end of the output are drawn. A heatmap "
                     "shows where this retrieval read, not why the output was produced.")))
    return out


def _entropy_figure(checklist: Checklist) -> list[figs.Figure]:
    table = next((ev.frame for ev in checklist.item("distributions").evidence
                  if ev.name == "distribution_metrics"), None)
    if table is None:
        return []
    entropy = figs.finite_or_empty(table[table["metric"] == "entropy_norm"], "mean")
    if entropy.empty:
        return []
    return [figs.site_head_heatmap(
        "entropy_by_head", entropy, "mean", vmin=0.0, vmax=1.0,
        title="Normalised entropy by site and head",
        caption="Mean entropy_norm = H / ln(n_valid) over counted rows: 0 is all weight on "
                "one key, 1 is uniform over the eligible keys.")]


def _masked_mass_figure(audit: ValidityAudit) -> list[figs.Figure]:
    frame = figs.finite_or_empty(audit.site_summary[["site", "masked_mass_max"]],
                                 "masked_mass_max")
    if frame.empty:
        return []
    return [figs.site_bars(
        "masked_mass", frame, "masked_mass_max", tolerance=audit.max_masked_mass,
        title="Largest masked mass per site",
        caption=f"The largest weight sum on ineligible keys in any counted row; dashed: the "
                f"tolerance {audit.max_masked_mass:g}. No bar means no mass on ineligible "
                "keys.")]


def _intervention_figures(tables: dict[str, pd.DataFrame]) -> list[figs.Figure]:
    out = []
    per_row = find_table(tables, ("max_attention", "perm_median_tvd"))
    if per_row is not None:
        bins = pd.cut(per_row["max_attention"].clip(0.0, 1.0), [0, 0.25, 0.5, 0.75, 1.0],
                      include_lowest=True)
        binned = figs.finite_or_empty(per_row.assign(max_attention_bin=bins.astype(str)),
                                      "perm_median_tvd")
        if not binned.empty:
            out.append(figs.binned_violins(
                "permutation_tvd", binned, "max_attention_bin", "perm_median_tvd",
                order=[str(b) for b in bins.cat.categories], threshold=SMALL_TVD,
                title="Permutation: median TVD by max attention",
                caption="Per row, the median TVD of the output distribution over the "
                        "permutations, in 4 equal-width bins of the row's largest weight "
                        f"(Jain & Wallace's plot); dashed: {SMALL_TVD:g}."))
    agreement = agreement_summary(tables)
    if agreement is not None:
        frame = figs.finite_or_empty(agreement, "kendall_tau_mean")
        if not frame.empty:
            out.append(figs.bars(
                "agreement", frame, "pair", "kendall_tau_mean",
                title="Agreement between importance rankings: Kendall tau-b",
                caption="Mean Kendall tau-b per (example, step) over eligible keys, for each "
                        "pair of attention, attributions and leave-one-out. Jain & Wallace "
                        "report 0.24-0.44 between attention and gradients for BiLSTM "
                        "classifiers with additive attention (not this task)."))
    return out
