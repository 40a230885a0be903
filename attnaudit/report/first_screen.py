"""The report's first screen, from the audit's tables alone: the two verdict cards with
their key numbers, what was and was not tested, and where to read next.

Presentation only: every number is one of the tables' (the validity card's are the
``site_summary`` counts and maxima over every counted row; the explanation card's are the
``claims`` table's estimates and 95 % intervals), selected and formatted here. A table that
is missing (a checks-only audit, an older report) leaves its part out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pandas as pd

from attnaudit.attribution.options import QUICK_OMITTED
from attnaudit.checklist.claims import HEADLINE
from attnaudit.checklist.items import NOT_RECORDED, NOT_TESTED
from attnaudit.report.contributions import not_computed_text
from attnaudit.report.html import interval_text
from attnaudit.report.tables import format_cell

NOT_TESTED_PREFIX = "Not tested: "


@dataclass(frozen=True)
class KeyNumber:
    """A number of the validity card: what it is, its value as text, and a note."""

    label: str
    value: str
    note: str = ""


@dataclass(frozen=True)
class ClaimLine:
    """A claim of the explanation card: its status and number with its 95 % interval."""

    key: str
    question: str
    status: str
    number: str


@dataclass(frozen=True)
class Gap:
    """Something this audit did not test, and why (in words)."""

    what: str
    why: str


@dataclass(frozen=True)
class Link:
    """An anchor on the page and the words that lead to it."""

    href: str
    text: str


@dataclass(frozen=True)
class FirstScreen:
    validity: list[KeyNumber] = field(default_factory=list)
    headline: ClaimLine | None = None
    claims: list[ClaimLine] = field(default_factory=list)
    tested: list[str] = field(default_factory=list)
    not_tested: list[Gap] = field(default_factory=list)
    read_next: list[Link] = field(default_factory=list)


def _count(frame: pd.DataFrame, column: str) -> int | None:
    return int(frame[column].fillna(0).sum()) if column in frame.columns else None


def _largest(frame: pd.DataFrame, column: str) -> float | None:
    if column not in frame.columns:
        return None
    values = pd.to_numeric(frame[column], errors="coerce").dropna()
    return None if values.empty else float(values.max())


def validity_numbers(tables: Mapping[str, pd.DataFrame]) -> list[KeyNumber]:
    """The validity card's numbers: sites, counted rows, the largest row-sum error and
    masked mass, and the rows with non-finite or negative weights or no eligible key, each
    summed or maximised over ``site_summary``'s sites."""
    summary = tables.get("site_summary")
    if summary is None or summary.empty:
        return []
    sites = tables.get("sites")
    out = [KeyNumber("attention sites checked", str(len(summary)))]
    rows = _count(summary, "rows")
    if rows is not None:
        out.append(KeyNumber("counted rows", f"{rows:,}"))
    error = _largest(summary, "row_sum_error_max")
    if error is not None:
        tolerance = None if sites is None else _largest(sites, "row_sum_tolerance")
        out.append(KeyNumber("largest |row sum - 1|", format_cell(error),
                             "" if tolerance is None else f"tolerance {tolerance:g}"))
    mass = _largest(summary, "masked_mass_max")
    out.append(KeyNumber("largest weight on ineligible keys",
                         "not measured" if mass is None else format_cell(mass)))
    for column, label in (("non_finite_rows", "rows with non-finite weights"),
                          ("negative_rows", "rows with negative weights"),
                          ("all_masked_rows", "rows with no eligible key")):
        count = _count(summary, column)
        if count is not None:
            out.append(KeyNumber(label, f"{count:,}"))
    return out


def claim_lines(tables: Mapping[str, pd.DataFrame]) -> tuple[ClaimLine | None, list[ClaimLine]]:
    """The headline claim and the others, in the ``claims`` table's order."""
    claims = tables.get("claims")
    if claims is None or claims.empty:
        return None, []
    lines = [ClaimLine(str(c.claim), str(c.question), str(c.status),
                       interval_text(float(c.estimate), float(c.estimate_low),
                                     float(c.estimate_high)))
             for c in claims.itertuples(index=False)]
    headline = next((line for line in lines if line.key == HEADLINE), None)
    return headline, [line for line in lines if line.key != HEADLINE]


def _counted(statuses: pd.Series) -> str:
    counts = statuses.value_counts(sort=False)
    return ", ".join(f"{n} {status}" for status, n in counts.items())


def tested_lines(tables: Mapping[str, pd.DataFrame]) -> list[str]:
    """What was tested: the checklist items recorded, the claims tested, the contribution
    and importance measures computed."""
    out = []
    checklist = tables.get("checklist")
    if checklist is not None and len(checklist):
        recorded = checklist[checklist["status"] != NOT_RECORDED]
        out.append(f"{len(recorded)} of {len(checklist)} checklist items recorded"
                   + (f" ({_counted(recorded['status'])})" if len(recorded) else ""))
    _, claims = claim_lines(tables)
    if claims:
        tested = pd.Series([c.status for c in claims if c.status != NOT_TESTED], dtype=object)
        out.append(f"{len(tested)} of {len(claims)} explanation claims tested"
                   + (f" ({_counted(tested)})" if len(tested) else ""))
    measures = tables.get("contribution_measures")
    if measures is not None and len(measures):
        computed = list(measures.loc[measures["status"] == "computed", "measure"])
        out.append("contribution measures computed: " + (", ".join(computed) or "none"))
    faithfulness = tables.get("faithfulness_summary")
    if faithfulness is not None and len(faithfulness):
        out.append(f"{len(faithfulness)} importance measures ranked by faithfulness")
    return out


def gaps(tables: Mapping[str, pd.DataFrame], *, quick: bool = False) -> list[Gap]:
    """What was not tested, with why: the claims not tested, the checklist items not
    recorded, the contribution measures not computed, in a quick audit the attribution it
    leaves out (when the faithfulness table has no row of it) and, when the explanation
    verdict itself is not tested (no intervention suite), its answer."""
    out = []
    _, claims = claim_lines(tables)
    frame = tables.get("claims")
    answers = {} if frame is None else dict(zip(frame["claim"], frame["answer"], strict=True))
    for claim in claims:
        if claim.status == NOT_TESTED:
            why = str(answers.get(claim.key, ""))
            out.append(Gap(claim.question, why.removeprefix(NOT_TESTED_PREFIX)))
    verdicts = tables.get("verdicts")
    if verdicts is not None and not claims:
        for v in verdicts.itertuples(index=False):
            if v.status == NOT_TESTED:
                out.append(Gap(str(v.question), str(v.answer).removeprefix(NOT_TESTED_PREFIX)))
    checklist = tables.get("checklist")
    if checklist is not None:
        for item in checklist[checklist["status"] == NOT_RECORDED].itertuples(index=False):
            out.append(Gap(str(item.title), str(item.summary)))
    measures = tables.get("contribution_measures")
    if measures is not None:
        for m in measures[measures["status"] != "computed"].itertuples(index=False):
            out.append(Gap(f"contribution measure {m.measure}",
                           not_computed_text(str(m.status), str(m.reason))))
    faithfulness = tables.get("faithfulness_summary")
    if quick and faithfulness is not None:
        for method in sorted(set(QUICK_OMITTED) - set(faithfulness["measure"])):
            out.append(Gap(f"importance measure {method}",
                           "not run: a quick audit leaves it out; the full report computes it"))
    return out


def read_next(tables: Mapping[str, pd.DataFrame], *, explorer: bool) -> list[Link]:
    """Links to the sections that matter: the checklist items that fail or warn, the
    claims in full, the faithfulness table, weights vs contributions, the explorer, the
    misconceptions and the whole checklist (each only when the page has it)."""
    out = []
    checklist = tables.get("checklist")
    if checklist is not None:
        for number, item in enumerate(checklist.itertuples(index=False), start=1):
            if item.status in ("fail", "warn"):
                out.append(Link(f"#item-{item.item}",
                                f"{number}. {item.title} ({item.status})"))
    claims = tables.get("claims")
    if claims is not None and len(claims):
        out.append(Link("#claims-explanation", "each explanation claim with its evidence"))
    if "faithfulness_summary" in tables:
        out.append(Link("#table-faithfulness_summary",
                        "faithfulness of each importance measure (table)"))
    if "weights_vs_contributions" in tables:
        out.append(Link("#weights-vs-contributions", "weights vs contributions"))
    if explorer:
        out.append(Link("#explorer", "the attention explorer"))
    out.append(Link("#misconceptions", "misconceptions this evidence bears on"))
    if checklist is not None:
        out.append(Link("#contents", "the whole checklist"))
    return out


def first_screen(tables: Mapping[str, pd.DataFrame], *, explorer: bool,
                 quick: bool = False) -> FirstScreen:
    """The first screen's content from the audit's tables by CSV name; explorer: whether
    the page has the attention explorer; quick: whether the audit ran with ``--quick``."""
    headline, claims = claim_lines(tables)
    return FirstScreen(validity=validity_numbers(tables), headline=headline, claims=claims,
                       tested=tested_lines(tables), not_tested=gaps(tables, quick=quick),
                       read_next=read_next(tables, explorer=explorer))
