"""Findings: the checks of a validity audit, one per site, as the gate and report read them.

A :class:`Finding` says whether one site passes one check (``pass``), fails it (``fail``:
the gate exits 1) or only warrants a look (``warn``), with the failing row count and the
worst value. :func:`summarise_sites` folds the audit's metrics table into one row per site;
:func:`site_findings` turns that row into findings for given tolerances.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

from attnaudit.analysis.degenerate import DegenerateCounter
from attnaudit.capturing.parity import PARITY_CALLS_PER_SITE
from attnaudit.validity.rules import CAPTURED_RULE

# Checks that can fail (and fail the gate); the others (negative, eligibility) only warn.
GATE_CHECKS = ("non_finite", "masked_mass", "row_sum", "all_masked_nan", "softmax_axis",
               "backend_parity")


@dataclass(frozen=True)
class Finding:
    """One check at one site.

    status: "pass", "fail" (the gate exits 1) or "warn". rows: failing rows, each an
    (example, head, query step). value: the worst value seen (e.g. the largest masked
    mass), when the check has one.
    """

    site: str
    check: str
    status: str
    rows: int
    detail: str
    value: float | None = None


def findings_frame(findings: Sequence[Finding]) -> pd.DataFrame:
    """Findings as a tidy table: site, check, status, rows, detail, value."""
    columns = list(Finding.__dataclass_fields__)
    return pd.DataFrame([asdict(f) for f in findings], columns=columns)


def describe_tolerance(tolerance: float | None) -> str:
    """A tolerance for a message: its value, or that the dtype rule sets it per site."""
    return "by dtype and key count" if tolerance is None else f"{tolerance:g}"


def failing_sites(findings: Iterable[Finding]) -> list[str]:
    """Sites with a failing check, in order of first appearance."""
    return list(dict.fromkeys(f.site for f in findings if f.status == "fail"))


SUMMARY_COLUMNS = ["site", "kind", "rows", "non_finite_rows", "masked_mass_max", "masked_rows",
                   "row_sum_error_max", "row_sum_rows", "negative_rows", "all_masked_rows",
                   "all_masked_nan", "all_masked_zeros", "all_masked_uniform",
                   "all_masked_behaviour", "softmax_axis_suspect_rows", "entropy_norm_mean",
                   "max_weight_mean", "n_valid_mean", "score_min", "score_max",
                   "masked_score_max", "mask_fill", "output_norm_mean"]


def summarise_sites(metrics: pd.DataFrame, sites: list[str]) -> pd.DataFrame:
    """One row per site from the metrics table: row counts, worst values, means.

    rows: rows audited; *_rows and all_masked*: row counts (sums of 0/1 per-row flags);
    *_max: the largest per-row value (NaN when no row defines it); *_mean: the mean over
    rows that define it; all_masked_behaviour: what the model produced on rows with no
    eligible key ("NaN", "zeros", "uniform", mixtures, or "none seen"); score_min /
    score_max: the range of finite scores on eligible keys; mask_fill: the scores seen on
    ineligible keys ("-inf", the largest finite one, both, or "" when none was seen or
    scores were not kept) — a fill of 0 leaks mass.
    """
    # one pass over the table: per (site, metric) the sum of sums and of counts, the
    # largest max and the smallest min
    cells = metrics.groupby(["site", "metric"], sort=False).agg(
        sum=("sum", "sum"), n=("n", "sum"), max=("max", "max"), min=("min", "min"))
    cells = cells.to_dict("index")
    kinds = metrics.drop_duplicates("site").set_index("site")["kind"].to_dict()
    missing = {"sum": 0.0, "n": 0, "max": math.nan, "min": math.nan}
    rows = []
    for site in sites:

        def total(metric: str, site: str = site) -> int:
            return round(float(cells.get((site, metric), missing)["sum"]))

        def largest(metric: str, site: str = site) -> float:
            return float(cells.get((site, metric), missing)["max"])

        def smallest(metric: str, site: str = site) -> float:
            return float(cells.get((site, metric), missing)["min"])

        def mean(metric: str, site: str = site) -> float:
            cell = cells.get((site, metric), missing)
            return float(cell["sum"] / cell["n"]) if cell["n"] else math.nan

        counts = {b: total(f"all_masked_{b}") for b in ("nan", "zeros", "uniform")}
        rows.append({
            "site": site,
            "kind": kinds.get(site),
            "rows": int(cells.get((site, "non_finite"), missing)["n"]),
            "non_finite_rows": total("non_finite_rows"),
            "masked_mass_max": largest("masked_mass"),
            "masked_rows": total("masked_rows"),
            "row_sum_error_max": largest("row_sum_error"),
            "row_sum_rows": total("row_sum_rows"),
            "negative_rows": total("negative_rows"),
            "all_masked_rows": total("all_masked"),
            "all_masked_nan": counts["nan"],
            "all_masked_zeros": counts["zeros"],
            "all_masked_uniform": counts["uniform"],
            "all_masked_behaviour": _all_masked_behaviour(total("all_masked"), counts),
            "softmax_axis_suspect_rows": total("softmax_axis_suspect"),
            "entropy_norm_mean": mean("entropy_norm"),
            "max_weight_mean": mean("max_weight"),
            "n_valid_mean": mean("n_valid"),
            "score_min": smallest("score_min"),
            "score_max": largest("score_max"),
            "masked_score_max": largest("masked_score_max"),
            "mask_fill": _mask_fill(largest("masked_score_max"),
                                    total("masked_score_non_finite")),
            "output_norm_mean": mean("output_norm"),
        })
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def _mask_fill(largest_finite: float, non_finite: int) -> str:
    parts = (["-inf"] if non_finite else []) + (
        [f"{largest_finite:g}"] if math.isfinite(largest_finite) else [])
    return " and ".join(parts)


def _all_masked_behaviour(all_masked: int, counts: dict[str, int]) -> str:
    if all_masked == 0:
        return "none seen"
    labels = {"nan": "NaN", "zeros": "zeros", "uniform": "uniform"}
    parts = [(labels[k], v) for k, v in counts.items() if v]
    other = all_masked - sum(counts.values())
    if other > 0:
        parts.append(("other", other))
    if len(parts) == 1:
        return parts[0][0]
    return ", ".join(f"{label} ({n} rows)" for label, n in parts)


def _tolerance_finding(site: str, check: str, bad: int, total: int, largest: float,
                       tolerance: float, failing: str, quantity: str) -> Finding:
    """A finding for a per-row quantity held to a tolerance: ``bad`` of ``total`` rows over."""
    worst = _finite_or_none(largest)
    if bad:
        detail = (f"{bad} of {total} rows {failing.format(tol=tolerance)} "
                  f"(largest {worst:.3g})")
    else:
        detail = f"{quantity} at most {_fmt(worst)} (tolerance {tolerance:g})"
    return Finding(site, check, "fail" if bad else "pass", bad, detail, worst)


def site_findings(site_summary: pd.DataFrame, sites: pd.DataFrame | None,
                  max_masked_mass: float,
                  row_sum_tolerance: float | Mapping[str, float]) -> list[Finding]:
    """The gate checks (non_finite, masked_mass, row_sum, all_masked_nan: pass/fail), the
    warning on negative weights, the softmax-axis check (pass/fail), the eligibility
    warning and, where the sites table has a fused kernel's gap, the backend-parity check
    (pass/fail; :mod:`attnaudit.validity.parity`), per site, in that order.

    row_sum_tolerance: one value, or per site (the dtype rule gives each its own).

    ``sites`` (the sites table) tells which sites had no declared key rule; None skips the
    eligibility check.
    """
    rules = {} if sites is None else dict(zip(sites["site"], sites["eligibility"],
                                              strict=True))
    parity = ({} if sites is None or "backend_parity_calls" not in sites.columns else
              {row.site: row for row in sites.itertuples(index=False)
               if row.backend_parity_calls > 0})
    findings = []
    for s in site_summary.itertuples(index=False):
        site, total = s.site, int(s.rows)
        bad = int(s.non_finite_rows)
        findings.append(Finding(
            site, "non_finite", "fail" if bad else "pass", bad,
            f"{bad} of {total} rows have NaN or inf weights" if bad
            else f"all {total} rows finite"))
        findings.append(_tolerance_finding(
            site, "masked_mass", int(s.masked_rows), total, s.masked_mass_max,
            max_masked_mass, "put more than {tol:g} on ineligible keys", "masked mass"))
        findings.append(_tolerance_finding(
            site, "row_sum", int(s.row_sum_rows), total, s.row_sum_error_max,
            row_sum_tolerance if isinstance(row_sum_tolerance, float | int)
            else row_sum_tolerance[site], "have |sum - 1| above {tol:g}", "|row sum - 1|"))
        bad = int(s.all_masked_nan)
        findings.append(Finding(
            site, "all_masked_nan", "fail" if bad else "pass", bad,
            (f"{bad} rows with every key masked produce NaN" if bad else
             f"rows with every key masked: {int(s.all_masked_rows)}, behaviour: "
             f"{s.all_masked_behaviour}")))
        bad = int(s.negative_rows)
        findings.append(Finding(
            site, "negative", "warn" if bad else "pass", bad,
            f"{bad} rows have negative weights" if bad else "no negative weights"))
        bad = int(s.softmax_axis_suspect_rows)
        findings.append(Finding(
            site, "softmax_axis", "fail" if bad else "pass", bad,
            (f"{bad} rows were normalised over an axis that precedes the queries (or sum to "
             "1 over the query axis, not the key axis): softmax over the wrong dimension?")
            if bad else "rows normalised over the key axis"))
        if site in rules:
            captured_only = CAPTURED_RULE in rules[site]
            findings.append(Finding(
                site, "eligibility", "warn" if captured_only else "pass", 0,
                ("no declared key rule fits this site's shape: masked mass is measured "
                 "against the model's own mask, so a mask applied after the softmax or "
                 "filled with 0 would go unseen") if captured_only
                else f"key rule: {rules[site]}"))
        if site in parity:
            findings.append(_parity_finding(site, parity[site]))
    return findings


def _parity_finding(site: str, row: Any) -> Finding:
    """The backend-parity check of one site from its sites-table row."""
    calls, gap = int(row.backend_parity_calls), float(row.backend_parity_gap)
    relative, tolerance = (float(row.backend_parity_relative),
                           float(row.backend_parity_tolerance))
    measured = (f"the deployed fused kernel and capture's explicit P·V differ by at most "
                f"{gap:.3g} ({relative:.3g} of the output's largest magnitude) over {calls} "
                f"compared call(s) (the first {PARITY_CALLS_PER_SITE} per site and pass)")
    if relative > tolerance:
        return Finding(site, "backend_parity", "fail", 0,
                       f"{measured}, above the tolerance {tolerance:g}: the kernel users run "
                       "does not compute the attention the audited weights describe (its "
                       "scaling or mask handling differs?)", relative)
    return Finding(site, "backend_parity", "pass", 0,
                   f"{measured} (tolerance {tolerance:g})", relative)


def _finite_or_none(value: float) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


INPUT_SITE = "(input)"


def input_findings(counter: DegenerateCounter) -> list[Finding]:
    """The gate's view of the audited data: ``fail`` when every row is degenerate (there
    was no real input to judge), ``warn`` when some are, nothing when none is."""
    degenerate = counter.rows - counter.counted
    if not degenerate:
        return []
    reasons = ", ".join(f"{n} {reason}" for reason, n in counter.counts.items() if n)
    if counter.counted:
        return [Finding(INPUT_SITE, "degenerate", "warn", degenerate,
                        f"{degenerate} of {counter.rows} rows are degenerate ({reasons})")]
    return [Finding(INPUT_SITE, "degenerate", "fail", degenerate,
                    f"every one of the {counter.rows} rows is degenerate ({reasons}): the "
                    "audit saw no real input; check the tokenizer, the data and special_ids")]
