"""The report: an audit as a self-contained HTML page, CSV tables and a manifest.

:func:`write_report` writes

- ``DIR/index.html``: one file, inline CSS, figures as PNG data URIs and the attention
  explorer (:mod:`attnaudit.report.explorer`: inline script and data), no network access;
  every user-provided string is escaped;
- ``DIR/attention_maps.csv``: every value the explorer shows (the kept examples' maps);
- ``DIR/attention_top_keys.csv``: where a map's key axis is long (a long prompt), each row's
  exact top keys, key-0 and sink weights beside its block means;
- ``DIR/<table>.csv``: every table the page shows, whole and tidy;
- ``DIR/manifest.json``: model class, parameter count and content hash, library versions,
  seeds, data digest, sites, command line (see :mod:`attnaudit.report.manifest`), and the
  column types of every CSV so that the tables load back as they were.

This package only presents: every number comes from the audit (:func:`attnaudit.audit`),
whose :meth:`~attnaudit.Audit.save` calls :func:`write_report`. :func:`summary_html` is
the compact notebook view.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from attnaudit.analysis.example_maps import ExampleMaps
from attnaudit.attribution.loo import QUICK_LOO_EDITS
from attnaudit.checklist import Checklist
from attnaudit.report.contributions import contributions_section
from attnaudit.report.definitions import definition_blocks
from attnaudit.report.explorer import (
    CSV_NAME,
    TOP_KEYS_CSV,
    explorer_views,
    maps_frame,
    payload,
    site_tolerances,
    top_keys_frame,
)
from attnaudit.report.explorer_page import explorer_block
from attnaudit.report.first_screen import first_screen
from attnaudit.report.html import interval_text, render_summary, write_html
from attnaudit.report.item_figures import item_figures
from attnaudit.report.manifest import write_manifest
from attnaudit.report.tables import table_schema, view, write_csvs
from attnaudit.runtime.output_folder import OutputFolder

__all__ = ["summary_html", "write_report"]

def write_report(out_dir: str | Path, *, checklist: Checklist,
                 tables: Mapping[str, pd.DataFrame], manifest: Mapping[str, Any],
                 example: ExampleMaps | None, max_masked_mass: float | None,
                 description: str = "", force: bool = False,
                 examples: Sequence[ExampleMaps] = ()) -> Path:
    """Write the report of one audit to ``out_dir``; return the path of index.html.

    Args:
        out_dir: created if missing; a previous attnaudit output there is replaced whole
            once the new report is complete (:mod:`attnaudit.runtime.output_folder`); a folder
            holding other files is refused unless ``force``.
        checklist: the items, verdicts and misconceptions the page is organised by.
        tables: every table by CSV name (the checklist's evidence and its summaries).
        manifest: what reproduces the audit (target, model, data, options, command line).
        example: the first example's attention maps (heatmaps), or None.
        max_masked_mass: the masked-mass tolerance drawn on its figure.
        description: one paragraph on the target.
        force: replace ``out_dir`` even when it holds files that are not an attnaudit output.
        examples: the kept examples' maps, drawn by the attention explorer and written to
            ``attention_maps.csv`` (none: no explorer).
    """
    folder = OutputFolder.check(out_dir, force=force)
    views = {item.key: [view(ev.name, ev.title, ev.caption, ev.frame) for ev in item.evidence]
             for item in checklist.items}
    command_line = manifest.get("command_line")
    context = {
        "target_name": manifest["target"],
        "target_description": description,
        "manifest": manifest,
        "options": manifest["options"],
        "quick_loo_edits": QUICK_LOO_EDITS,
        "command_text": (command_line if isinstance(command_line, str)
                         else " ".join(command_line or ["(Python API)"])),
        "verdicts": checklist.verdicts,
        "misconceptions": checklist.misconceptions,
        "items": checklist.items,
        "figures": item_figures(tables, example, max_masked_mass),
        "tables": views,
        "definitions": definition_blocks(),
        "explorer": None,
        "contributions": contributions_section(tables, None if example is None
                                               else example.family),
    }
    explored = explorer_views(examples)
    if explored:
        data = payload(explored, max_masked_mass=max_masked_mass,
                       row_sum_tolerance=site_tolerances(tables.get("sites")))
        context["explorer"] = {"csv": CSV_NAME, "top_keys_csv": data["top_keys_csv"],
                               "examples": len(explored), "block": explorer_block(data)}
    context["first_screen"] = first_screen(tables, explorer=bool(explored),
                                           quick=bool(manifest["options"].get("quick")))
    with folder.assembling() as out:
        write_csvs(tables, out)
        if explored:
            maps_frame(explored).to_csv(out / CSV_NAME, index=False)
            tops = top_keys_frame(explored)
            if not tops.empty:
                tops.to_csv(out / TOP_KEYS_CSV, index=False)
        write_manifest({**manifest, "tables": table_schema(tables)}, out)
        page = write_html(context, out).name
    return folder.path / page


KEY_NUMBERS = {
    "perm_median_tvd": "median TVD under permutation",
    "perm_small_tvd_share": "share of rows barely moved by permutation (TVD < 0.05)",
    "zero_top_flip": "argmax flips when zeroing the top key",
    "zero_random_flip": "argmax flips when zeroing a random key",
    "uniform_flip": "argmax flips under uniform weights",
    "eps_max_jsd": "adversarial eps-max JSD (mean)",
}


def summary_html(tables: Mapping[str, pd.DataFrame], manifest: Mapping[str, Any]) -> str:
    """A compact HTML summary for notebooks: verdicts, item statuses and a few key numbers,
    from the audit's tables alone. Every value is escaped."""
    def records(name: str) -> list[dict[str, Any]]:
        frame = tables.get(name)
        return [] if frame is None else frame.to_dict("records")

    summary, nan = tables.get("summary"), float("nan")
    numbers = []
    if summary is not None:
        values = dict(zip(summary["metric"], summary["value"], strict=True))
        low = dict(zip(summary["metric"], summary.get("value_low", summary["value"] * nan),
                       strict=True))
        high = dict(zip(summary["metric"], summary.get("value_high", summary["value"] * nan),
                        strict=True))
        numbers = [(label, interval_text(values[key], low[key], high[key]))
                   for key, label in KEY_NUMBERS.items()
                   if key in values and pd.notna(values[key])]
    data = manifest.get("data", {})
    return render_summary({
        "target": manifest.get("target", ""),
        "examples": data.get("examples"),
        "sites": manifest.get("sites", []),
        "verdicts": records("verdicts"),
        "claims": [(c["question"], c["status"],
                    interval_text(c["estimate"], c["estimate_low"], c["estimate_high"]))
                   for c in records("claims")],
        "items": records("checklist"),
        "numbers": numbers,
    })
