"""The gate: a pass/fail judgement of an audit's validity findings (``attnaudit check``).

Status (:class:`GateStatus`, an :class:`~enum.IntEnum`: the exit code): 0 (:data:`HEALTHY`)
when every site passes; 1 (:data:`UNHEALTHY`) when any site
has non-finite weights, masked mass above the masked-mass tolerance, a row-sum error above
the row-sum tolerance (default: from the weights' dtype and key count, see
:func:`attnaudit.analysis.numerics.row_sum_tolerance`), NaN on rows whose keys are all
masked, or a deployed fused kernel whose output differs from the audited weights' ``P·V``
(:mod:`attnaudit.validity.parity`). :class:`GateResult` holds the judgement and renders it
as a short summary, JSON and JUnit XML (one testcase per site x check).
:meth:`attnaudit.Audit.gate` gives one; the command line prints it.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from enum import IntEnum
from typing import Any

import pandas as pd

from attnaudit.validity.findings import GATE_CHECKS, INPUT_SITE, Finding, failing_sites


class GateStatus(IntEnum):
    """The gate's status, named; an int, so ``status == 0`` and ``sys.exit(status)`` hold."""

    HEALTHY = 0
    UNHEALTHY = 1


HEALTHY, UNHEALTHY = GateStatus.HEALTHY, GateStatus.UNHEALTHY


@dataclass(repr=False)
class GateResult:
    """The gate's judgement of one audit.

    Attributes:
        target: the target's name. examples: examples audited.
        sites: the audit's sites table (one row per site: kind, role, mechanism,
            eligibility, weights_dtype, row_sum_tolerance, ...).
        findings: every check at every site.
        max_masked_mass: the masked-mass tolerance rows were counted at.
        row_sum_tolerance: the row-sum tolerance given, or None (each site's dtype rule,
            the sites table's ``row_sum_tolerance`` column).
    """

    target: str
    examples: int
    sites: pd.DataFrame
    findings: list[Finding]
    max_masked_mass: float
    row_sum_tolerance: float | None

    @property
    def status(self) -> GateStatus:
        """:data:`UNHEALTHY` when any finding fails, else :data:`HEALTHY` (the exit code)."""
        return UNHEALTHY if any(f.status == "fail" for f in self.findings) else HEALTHY

    @property
    def healthy(self) -> bool:
        return self.status == HEALTHY

    @property
    def failing_sites(self) -> list[str]:
        """Sites with a failing check, in order of first appearance."""
        return failing_sites(self.findings)

    def summary(self) -> str:
        """The human summary: one line per failing or warning check, then the verdict."""
        return summary_text(self)

    def __repr__(self) -> str:
        """One screen: status, counts, the first failing sites and the tolerances (the full
        findings: :meth:`summary`, :meth:`to_dict`)."""
        return gate_repr(self)

    def to_dict(self) -> dict[str, Any]:
        """The machine-readable result (``--json``): plain JSON types, no NaN."""
        return check_result(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def junit_xml(self, seconds: float) -> str:
        """JUnit XML; ``seconds``: the time the audit took."""
        return junit_xml(self, seconds)


def summary_text(result: GateResult) -> str:
    """The human summary: one line per failing or warning check, then the verdict."""
    findings = result.findings
    sites = list(result.sites["site"])
    lines = [f"attnaudit check: {result.target}: {result.examples} examples, {len(sites)} "
             f"attention site(s), masked mass tolerance {result.max_masked_mass:g}, row-sum "
             f"tolerance {_row_sum_tolerances(result)}"]
    for f in findings:
        if f.status != "pass":
            lines.append(f"{f.status.upper():4}  {f.site}  {f.check}: {f.detail}")
    failing = failing_sites(findings)
    if failing:
        at_sites = [site for site in failing if site != INPUT_SITE]
        lines.append(f"FAILED: {len(at_sites)} of {len(sites)} site(s) failing"
                     + (": " + ", ".join(at_sites) if at_sites else "")
                     + ("; every input row is degenerate" if INPUT_SITE in failing else ""))
    else:
        warnings = sum(f.status == "warn" for f in findings)
        lines.append(f"healthy: all {len(sites)} site(s) pass {', '.join(GATE_CHECKS)}"
                     + (f"; {warnings} warning(s)" if warnings else ""))
    return "\n".join(lines)


REPR_SITES = 8  # failing sites named in the repr; the rest are counted


def gate_repr(result: GateResult) -> str:
    """``GateResult(...)`` on a few lines: the status by name and value, examples, sites
    passing and failing (the first :data:`REPR_SITES` named), findings per status and the
    tolerances."""
    counts = {status: sum(f.status == status for f in result.findings)
              for status in ("pass", "warn", "fail")}
    failing = [site for site in result.failing_sites if site != INPUT_SITE]
    named = ", ".join(failing[:REPR_SITES]) + (f", ... ({len(failing) - REPR_SITES} more)"
                                               if len(failing) > REPR_SITES else "")
    sites = len(result.sites)
    return "\n".join([
        f"GateResult(target={result.target!r}, status={result.status.name} "
        f"({int(result.status)}), examples={result.examples},",
        f"  sites: {sites - len(failing)} of {sites} passing"
        + (f"; failing: {named}" if failing else "")
        + ("; every input row is degenerate" if INPUT_SITE in result.failing_sites else "")
        + ",",
        f"  findings: {len(result.findings)} ({counts['pass']} pass, {counts['warn']} warn, "
        f"{counts['fail']} fail),",
        f"  max_masked_mass={result.max_masked_mass:g}, row_sum_tolerance="
        f"{_row_sum_tolerances(result)})"])


def _row_sum_tolerances(result: GateResult) -> str:
    """The row-sum tolerance as given, or the per-dtype values the rule chose."""
    if result.row_sum_tolerance is not None:
        return f"{result.row_sum_tolerance:g}"
    chosen = result.sites.groupby("weights_dtype")["row_sum_tolerance"].max()
    return "by dtype (" + ", ".join(f"{dtype} up to {tol:.3g}"
                                    for dtype, tol in chosen.items()) + ")"


def check_result(result: GateResult) -> dict[str, Any]:
    """The machine-readable result (``--json``): plain JSON types, no NaN."""
    findings = result.findings
    failing_checks: dict[str, list[str]] = {}
    for f in findings:
        if f.status == "fail":
            failing_checks.setdefault(f.site, []).append(f.check)
    sites = [{
        "site": row.site, "kind": row.kind, "role": row.role, "mechanism": row.mechanism,
        "eligibility": row.eligibility, "weights_dtype": row.weights_dtype,
        "row_sum_tolerance": float(row.row_sum_tolerance),
        "scores_materialised_by_capture": bool(row.scores_materialised_by_capture),
        "status": "fail" if row.site in failing_checks else "pass",
        "failing_checks": failing_checks.get(row.site, []),
    } for row in result.sites.itertuples(index=False)]
    return {
        "target": result.target,
        "examples": result.examples,
        "healthy": result.healthy,
        "exit_code": int(result.status),
        "thresholds": {"max_masked_mass": result.max_masked_mass,
                       "row_sum_tolerance": result.row_sum_tolerance},
        "failing_sites": failing_sites(findings),
        "sites": sites,
        "findings": [asdict(f) for f in findings],
    }


def junit_xml(result: GateResult, seconds: float) -> str:
    """JUnit XML: one testsuite, one testcase per site x check, ``failure`` on failures and
    the detail of warnings in ``system-out``. ElementTree escapes every name and text."""
    findings = result.findings
    failures = sum(f.status == "fail" for f in findings)
    suite_name = f"attnaudit check: {result.target}"
    suites = ET.Element("testsuites", name="attnaudit check", tests=str(len(findings)),
                        failures=str(failures), errors="0", time=f"{seconds:.3f}")
    suite = ET.SubElement(suites, "testsuite", name=suite_name, tests=str(len(findings)),
                          failures=str(failures), errors="0", skipped="0",
                          time=f"{seconds:.3f}")
    for f in findings:
        case = ET.SubElement(suite, "testcase", classname=f"attnaudit.{result.target}.{f.site}",
                             name=f.check, time="0")
        if f.status == "fail":
            failure = ET.SubElement(case, "failure", message=f"{f.rows} rows: {f.detail}",
                                    type=f.check)
            failure.text = f"site {f.site}, check {f.check}: {f.detail}"
        elif f.status == "warn":
            ET.SubElement(case, "system-out").text = f"warning: {f.detail}"
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"
