"""The :class:`Audit`: one audit's results, and its views.

An audit is held as tidy tables (one per CSV of the report: ``audit.tables["rows"]``,
``audit.tables["sites"]`` ...), the manifest, and, for an audit run in this process, the
live parts they came from: the validity audit, the intervention suite (or why it was not
run) and the checklist. The views only present what is there:

- :meth:`Audit.save` / :meth:`Audit.to_html`: the report (``index.html``, CSVs, manifest);
- :meth:`Audit.gate`: the CI gate's judgement (:class:`attnaudit.validity.gate.GateResult`);
- :meth:`Audit.figure`: the report's figures as matplotlib figures;
- ``_repr_html_``: a compact summary in notebooks, and the attention explorer of the kept
  examples (:meth:`Audit.show`) for an audit run in this process;
- :meth:`Audit.load`: a saved report's tables and manifest, to compare audits without
  re-running them. A loaded audit has tables, verdicts and statuses, no live model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure as MplFigure

from attnaudit.analysis.degenerate import DegenerateCounter
from attnaudit.auditing.intervention_suite import InterventionSuite
from attnaudit.checklist import Checklist
from attnaudit.checklist.items import CLAIM_COLUMNS
from attnaudit.errors import AuditError, OptionError
from attnaudit.report import summary_html, write_report
from attnaudit.report.capture_view import examples_page
from attnaudit.report.contributions import contribution_figures
from attnaudit.report.explorer_page import ExplorerPage
from attnaudit.report.figures import Figure
from attnaudit.report.item_figures import item_figures
from attnaudit.report.tables import read_csvs
from attnaudit.validity.findings import input_findings, site_findings
from attnaudit.validity.gate import GateResult
from attnaudit.validity.result import ValidityAudit


@dataclass(repr=False)
class Audit:
    """One audit of one target.

    Attributes:
        target: the target's name. description: one paragraph on it.
        tables: every table by CSV name: the checklist's evidence (validity and
            intervention tables) plus ``verdicts``, ``checklist`` and ``misconceptions``.
        manifest: what reproduces the audit (model, libraries, seeds, data digest, sites,
            options, thresholds, command line).
        validity: the validity audit (None for a loaded audit).
        suite: the intervention suite; None when it was not run (``suite_reason`` says why)
            or the audit was loaded.
        suite_reason: why there is no suite.
        checklist: items, verdicts and misconceptions (None for a loaded audit).
    """

    target: str
    description: str
    tables: dict[str, pd.DataFrame]
    manifest: dict[str, Any]
    validity: ValidityAudit | None = None
    suite: InterventionSuite | None = None
    suite_reason: str | None = None
    checklist: Checklist | None = None

    @property
    def examples(self) -> int | None:
        """The number of examples audited (after ``limit``); None when the manifest does not
        record it."""
        examples = self.manifest.get("data", {}).get("examples")
        return None if examples is None else int(examples)

    @property
    def verdicts(self) -> dict[str, str]:
        """Verdict key (``validity``, ``explanation``) -> status; the explanation's is its
        headline claim's (supported, not supported, inconclusive, not tested)."""
        frame = self.tables.get("verdicts")
        return {} if frame is None else dict(zip(frame["verdict"], frame["status"],
                                                 strict=True))

    @property
    def claims(self) -> pd.DataFrame:
        """The explanation verdict's claims (claim, question, status, answer, estimate,
        estimate_low, estimate_high, threshold, examples; docs/metrics.md, "Explanation
        status"); empty for an audit written before them."""
        frame = self.tables.get("claims")
        return pd.DataFrame(columns=CLAIM_COLUMNS) if frame is None else frame

    @property
    def statuses(self) -> dict[str, str]:
        """Checklist item key -> status (pass, warn, fail, not recorded)."""
        frame = self.tables.get("checklist")
        return {} if frame is None else dict(zip(frame["item"], frame["status"], strict=True))

    @property
    def thresholds(self) -> dict[str, float | None]:
        """The tolerances rows were counted at: ``max_masked_mass``, ``row_sum_tolerance``
        (None: each site's dtype rule)."""
        if "thresholds" not in self.manifest:
            raise AuditError("this report's manifest does not record the tolerances rows were "
                             "counted at (written by an older attnaudit); re-run the audit")
        return dict(self.manifest["thresholds"])

    def save(self, out_dir: str | Path, *, force: bool = False) -> Path:
        """Write the report (index.html, one CSV per table, manifest.json) to ``out_dir``;
        return the path of index.html. A previous attnaudit output there is replaced whole
        once the new report is complete; a folder holding other files is refused unless
        ``force`` (:mod:`attnaudit.runtime.output_folder`)."""
        checklist = self._live("save", self.checklist)
        return write_report(out_dir, checklist=checklist, tables=self.tables,
                            manifest=self.manifest,
                            example=None if self.validity is None else self.validity.example,
                            max_masked_mass=self.thresholds["max_masked_mass"],
                            description=self.description, force=force,
                            examples=[] if self.validity is None
                            else self.validity.kept_examples)

    def show(self) -> ExplorerPage:
        """The report's attention explorer alone, for a notebook (it renders inline, in an
        iframe: no server, no widget extension) or to save as one HTML file."""
        validity = self._live("show", self.validity)
        if not validity.kept_examples:
            raise AuditError("this audit kept no example maps (a checks-only audit); run "
                             "attnaudit.audit without checks_only to explore its attention")
        return examples_page(validity.kept_examples, title=f"Attention: {self.target}",
                             max_masked_mass=self.thresholds["max_masked_mass"],
                             sites=self.tables.get("sites"))

    def to_html(self, out_dir: str | Path, *, force: bool = False) -> Path:
        """The report, as :meth:`save` writes it (the page links its CSVs beside it)."""
        return self.save(out_dir, force=force)

    def gate(self, max_masked_mass: float | None = None,
             row_sum_tolerance: float | None = None) -> GateResult:
        """The CI gate's judgement: status 0 when every site passes, 1 otherwise, with the
        failing sites. Tolerances default to those the audit counted rows at; others raise
        ValueError (rows are counted while streaming: run ``attnaudit.audit`` with them)."""
        thresholds = self.thresholds
        for name, given in (("max_masked_mass", max_masked_mass),
                            ("row_sum_tolerance", row_sum_tolerance)):
            if given is not None and given != thresholds[name]:
                raise OptionError(f"rows were counted at {name}={thresholds[name]}; run "
                                  f"attnaudit.audit(..., {name}={given:g}) for another "
                                  "tolerance")
        sites = self.tables["sites"]
        max_masked = thresholds["max_masked_mass"]
        if max_masked is None:
            raise AuditError("this audit recorded no masked-mass tolerance (written by an "
                             "older attnaudit); re-run the audit")
        if self.validity is not None:
            findings = self.validity.findings() + input_findings(self.validity.degenerate)
        elif "row_sum_tolerance" not in sites.columns:
            raise AuditError("this report's sites table has no per-site row-sum tolerance "
                             "(written by an older attnaudit); re-run the audit")
        else:
            findings = site_findings(self.tables["site_summary"], sites, max_masked,
                                     dict(zip(sites["site"], sites["row_sum_tolerance"],
                                              strict=True)))
            recorded = self.manifest.get("input_rows")
            if recorded is not None:
                findings += input_findings(DegenerateCounter(recorded["rows"],
                                                             recorded["degenerate"]))
        return GateResult(self.target, int(self.manifest["data"]["examples"]), sites,
                          findings, max_masked, thresholds["row_sum_tolerance"])

    def figure_names(self) -> list[str]:
        """The names :meth:`figure` accepts: the report's figures for this audit."""
        return list(self._figures)

    def figure(self, name: str) -> MplFigure:
        """The report's figure ``name`` (see :meth:`figure_names`) as a matplotlib figure:
        ``example_map_<i>`` (first example, site i), ``entropy_by_head``, ``masked_mass``,
        ``permutation_tvd``, ``agreement``, with target-side attribution
        ``attribution_sides``, and with contribution measures ``contribution_maps``. Example
        maps need a live audit."""
        if name not in self._figures:
            raise KeyError(f"no figure {name!r} in this audit; it has "
                           f"{', '.join(self._figures) or 'none'}")
        return self._figures[name].figure

    @cached_property
    def _figures(self) -> dict[str, Figure]:
        """The report's figures by name, drawn once, on first use."""
        example = None if self.validity is None else self.validity.example
        tolerance = self.manifest.get("thresholds", {}).get("max_masked_mass")
        groups = [*item_figures(self.tables, example, tolerance).values(),
                  contribution_figures(self.tables, None if example is None
                                       else example.family)]
        return {f.name: f for group in groups for f in group}

    def __repr__(self) -> str:
        """A few lines: the target, examples audited and sites, the verdicts, the checklist's
        statuses and whether the intervention suite ran (the tables: :attr:`tables`)."""
        return audit_repr(self)

    def _repr_html_(self) -> str:
        summary = summary_html(self.tables, self.manifest)
        if self.validity is None or not self.validity.kept_examples:
            return summary
        return summary + self.show()._repr_html_()

    @classmethod
    def load(cls, out_dir: str | Path) -> Audit:
        """A saved report's tables and manifest (``out_dir`` as :meth:`save` wrote it, or
        ``attnaudit report --out``), without a live model. A report written before the
        manifest recorded column types and tolerances loads with the types pandas infers;
        its :meth:`gate` then says it cannot judge."""
        out = Path(out_dir)
        path = out / "manifest.json"
        if not path.is_file():
            raise AuditError(f"{out} holds no manifest.json: not an attnaudit report folder")
        manifest = json.loads(path.read_text(encoding="utf-8"))
        schema = manifest.pop("tables", None)  # absent in reports of older versions
        return cls(target=manifest["target"], description=manifest.get("description", ""),
                   tables=read_csvs(out, schema), manifest=manifest,
                   suite_reason="loaded from a saved report")

    def _live(self, view: str, part: Any) -> Any:
        if part is None:
            raise AuditError(f"Audit.{view} needs the audit run in this process (its checklist "
                             "text and example maps); a loaded audit has its tables only")
        return part


def audit_repr(audit: Audit) -> str:
    """``Audit(...)``: one line per part, the checklist items grouped by status."""
    examples = "?" if audit.examples is None else audit.examples
    sites = len(audit.manifest.get("sites", []))
    by_status: dict[str, list[str]] = {}
    for item, status in audit.statuses.items():
        by_status.setdefault(status, []).append(item)
    verdicts = ", ".join(f"{key}={status}" for key, status in audit.verdicts.items())
    checklist = "; ".join(f"{status}: {', '.join(items)}" for status, items in by_status.items())
    record = audit.manifest.get("interventions", {})  # a loaded audit's record of its run
    ran = record.get("ran", audit.suite is not None)
    suite = "ran" if ran else f"not run ({record.get('reason', audit.suite_reason)})"
    return "\n".join([f"Audit(target={audit.target!r}, examples={examples}, sites={sites},",
                      f"  verdicts: {verdicts or 'none'},",
                      f"  checklist: {checklist or 'none'},",
                      f"  interventions: {suite})"])
