"""``attnaudit check``: the CI gate over the validity audit's findings.

Exit status: 0 when every site passes; 1 when any site has non-finite weights, masked mass
above ``--max-masked-mass``, a row-sum error above ``--row-sum-tolerance`` (default: from
the weights' dtype and key count, see :func:`attnaudit.analysis.numerics.row_sum_tolerance`)
or NaN on rows whose keys are all masked; 2 for usage and loading errors (raised as
:class:`~attnaudit.errors.AttnauditError`, turned into 2 by :func:`attnaudit.cli.main`).
stdout carries the result (a short summary, or JSON with ``--json``); progress goes to
stderr. ``--junit FILE`` also writes JUnit XML: one testcase per site x check.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict
from pathlib import Path
from typing import Any

from attnaudit.audit import ValidityAudit, run_validity_audit
from attnaudit.degenerate import INPUT_SITE, input_findings
from attnaudit.errors import AttnauditError
from attnaudit.findings import GATE_CHECKS, Finding, failing_sites
from attnaudit.output_folder import check_output_file

HEALTHY, UNHEALTHY, USAGE_ERROR = 0, 1, 2


class GateError(AttnauditError):
    """The gate was asked for something it cannot do (bad option value, unwritable file)."""


def check_command(args: argparse.Namespace) -> int:
    """Run the gate for parsed ``attnaudit check`` arguments; return the exit status."""
    from attnaudit.cli import load_cli_target

    _check_options(args)
    if args.junit is not None:
        check_output_file(args.junit, "JUnit XML")  # before the audit, not after it
    started = time.perf_counter()
    print("attnaudit check: loading the target", file=sys.stderr, flush=True)
    target = load_cli_target(args)
    audit = run_validity_audit(target, limit=args.limit, progress=True, keep_example=False,
                               regions=False, timing=False, checks_only=True,
                               max_masked_mass=args.max_masked_mass,
                               row_sum_tolerance=args.row_sum_tolerance)
    findings = audit.findings() + input_findings(audit.degenerate)
    seconds = time.perf_counter() - started
    status = UNHEALTHY if any(f.status == "fail" for f in findings) else HEALTHY
    if args.junit:
        write_junit(Path(args.junit), audit, findings, seconds)
    if args.json:
        print(json.dumps(check_result(audit, findings, status), indent=2))
    else:
        print(summary_text(audit, findings))
    return status


def _check_options(args: argparse.Namespace) -> None:
    for option, value in (("--max-masked-mass", args.max_masked_mass),
                          ("--row-sum-tolerance", args.row_sum_tolerance)):
        if value is not None and (not math.isfinite(value) or value < 0):
            raise GateError(f"{option} must be a finite number >= 0, got {value}")


def summary_text(audit: ValidityAudit, findings: list[Finding]) -> str:
    """The human summary: one line per failing or warning check, then the verdict."""
    sites = list(audit.site_summary["site"])
    lines = [f"attnaudit check: {audit.target}: {audit.examples} examples, {len(sites)} "
             f"attention site(s), masked mass tolerance {audit.max_masked_mass:g}, row-sum "
             f"tolerance {_row_sum_tolerances(audit)}"]
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


def _row_sum_tolerances(audit: ValidityAudit) -> str:
    """The row-sum tolerance as given, or the per-dtype values the rule chose."""
    if audit.row_sum_tolerance is not None:
        return f"{audit.row_sum_tolerance:g}"
    chosen = audit.sites.groupby("weights_dtype")["row_sum_tolerance"].max()
    return "by dtype (" + ", ".join(f"{dtype} up to {tol:.3g}"
                                    for dtype, tol in chosen.items()) + ")"


def check_result(audit: ValidityAudit, findings: list[Finding], status: int) -> dict[str, Any]:
    """The machine-readable result (``--json``): plain JSON types, no NaN."""
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
    } for row in audit.sites.itertuples(index=False)]
    return {
        "target": audit.target,
        "examples": audit.examples,
        "healthy": status == HEALTHY,
        "exit_code": status,
        "thresholds": {"max_masked_mass": audit.max_masked_mass,
                       "row_sum_tolerance": audit.row_sum_tolerance},
        "failing_sites": failing_sites(findings),
        "sites": sites,
        "findings": [asdict(f) for f in findings],
    }


def junit_xml(audit: ValidityAudit, findings: list[Finding], seconds: float) -> str:
    """JUnit XML: one testsuite, one testcase per site x check, ``failure`` on failures and
    the detail of warnings in ``system-out``. ElementTree escapes every name and text."""
    failures = sum(f.status == "fail" for f in findings)
    suite_name = f"attnaudit check: {audit.target}"
    suites = ET.Element("testsuites", name="attnaudit check", tests=str(len(findings)),
                        failures=str(failures), errors="0", time=f"{seconds:.3f}")
    suite = ET.SubElement(suites, "testsuite", name=suite_name, tests=str(len(findings)),
                          failures=str(failures), errors="0", skipped="0",
                          time=f"{seconds:.3f}")
    for f in findings:
        case = ET.SubElement(suite, "testcase", classname=f"attnaudit.{audit.target}.{f.site}",
                             name=f.check, time="0")
        if f.status == "fail":
            failure = ET.SubElement(case, "failure", message=f"{f.rows} rows: {f.detail}",
                                    type=f.check)
            failure.text = f"site {f.site}, check {f.check}: {f.detail}"
        elif f.status == "warn":
            ET.SubElement(case, "system-out").text = f"warning: {f.detail}"
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def write_junit(path: Path, audit: ValidityAudit, findings: list[Finding],
                seconds: float) -> None:
    try:
        path.write_text(junit_xml(audit, findings, seconds), encoding="utf-8")
    except OSError as exc:
        raise GateError(f"cannot write JUnit XML to {path}: {exc.strerror or exc}") from exc
