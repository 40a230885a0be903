"""The claims the explanation verdict answers, each from a number and its bootstrap interval.

Every claim is answered ``supported``, ``not supported``, ``inconclusive`` (its interval
straddles the threshold, or there is no interval: fewer than two examples) or ``not tested``
(what it needs did not run). A claim that was not tested never counts as met. The
thresholds are the constants below, documented in docs/metrics.md ("Explanation status");
the intervals are :func:`attnaudit.analysis.bootstrap.bootstrap_interval` over examples.

The headline claim, "the attention weights are a faithful explanation of this model's
outputs", is supported only when every claim in :data:`REQUIRED` is, and not supported as
soon as one of them is not: the weights-vs-contributions judgement is one of them, so the
verdict and that judgement read the same number and cannot disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import pandas as pd

from attnaudit.analysis.bootstrap import Interval, bootstrap_interval
from attnaudit.checklist.items import (
    FAIL,
    INCONCLUSIVE,
    NOT_RECORDED,
    NOT_SUPPORTED,
    NOT_TESTED,
    PASS,
    SUPPORTED,
    WARN,
    Claim,
)
from attnaudit.interventions.permutation import SMALL_TVD
from attnaudit.interventions.protocol import ROWS, table_with

# The claim "outputs depend on which keys the weights select" needs the share of rows whose
# median permutation TVD is below SMALL_TVD to lie below this, interval included.
SENSITIVE_BELOW = 0.5
# Zeroing the top-weighted key must flip the argmax more often than zeroing a random other
# eligible key: the per-row difference of the two flips must exceed this, interval included.
TOP_FLIP_MARGIN = 0.0
# Mean eps-max JSD (of at most ln 2) from which the adversarial search counts as having
# found very different weights with the same output.
ADVERSARIAL_DIFFERENT = 0.1
# The top-weight key counts as the largest contributor when the keys differ in fewer rows
# than this share (interval included); from it up, the misconception is refuted.
MATERIAL_SHARE = 0.05
# The faithfulness number that ranks measures (faithfulness_summary; higher = more
# faithful), and the floor it is compared with.
FAITHFULNESS = "aopc_comprehensiveness"
FLOOR, WEIGHTS = "random", "weights"
FAITHFULNESS_TABLE = "faithfulness_summary"
WEIGHTS_VS_CONTRIBUTIONS = "weights_vs_contributions"
# The contribution measure the weights-vs-contributions claim quotes, the first computed
# (value zeroing last: the one measure a softmax-path model without values still gets).
PREFERRED = ("alti", "value_norm", "rollout", "value_zeroing")

HEADLINE = "weights_explain"
REQUIRED = ("sensitivity", "top_key_matters", "unique_allocation", "above_random",
            "rank_among_measures", "top_key_contributes")
QUESTIONS = {
    HEADLINE: "The attention weights are a faithful explanation of this model's outputs",
    "sensitivity": "The output depends on which keys the weights select (permutation)",
    "top_key_matters": "Zeroing the top-weighted key matters more than zeroing a random one",
    "unique_allocation": "No very different weights give the same output (adversarial search)",
    "above_random": "The weights rank keys more faithfully than the random floor",
    "rank_among_measures": "The weights rank among the most faithful importance measures",
    "most_faithful": "Which importance measure is most faithful here",
    "top_key_contributes": "The key with the largest weight is the largest contributor",
}
_ITEM_STATUS = {SUPPORTED: PASS, INCONCLUSIVE: WARN, NOT_SUPPORTED: FAIL,
                NOT_TESTED: NOT_RECORDED}


def item_status(claim_status: str) -> str:
    """The checklist status of a claim status (supported: pass, inconclusive: warn, not
    supported: fail, not tested: not recorded)."""
    return _ITEM_STATUS[claim_status]


def _examples(frame: pd.DataFrame) -> np.ndarray | None:
    return frame["example"].to_numpy() if "example" in frame.columns else None


def _claim(key: str, status: str, answer: str, number: Interval | None = None,
           threshold: float = float("nan")) -> Claim:
    nan = float("nan")
    return Claim(key, QUESTIONS[key], status, answer,
                 nan if number is None else number.estimate,
                 nan if number is None else number.low,
                 nan if number is None else number.high,
                 threshold, 0 if number is None else number.examples)


def _not_tested(key: str, why: str) -> Claim:
    return _claim(key, NOT_TESTED, f"Not tested: {why}.")


def against(number: Interval, threshold: float, *, below: bool) -> str:
    """supported when the whole interval lies on the claimed side of ``threshold`` (below
    it, or above it), not supported when it lies wholly on the other side, inconclusive
    when it straddles the threshold or is undefined (fewer than two examples)."""
    if not np.isfinite(number.estimate):
        return NOT_TESTED
    if not number.defined:
        return INCONCLUSIVE
    low, high = (number.low, number.high) if below else (-number.high, -number.low)
    cut = threshold if below else -threshold
    if high < cut:
        return SUPPORTED
    if low >= cut:
        return NOT_SUPPORTED
    return INCONCLUSIVE


def _threshold_claim(key: str, number: Interval, threshold: float, below: bool,
                     what: str) -> Claim:
    side = "below" if below else "above"
    return _claim(key, against(number, threshold, below=below),
                  f"{what}: {number}; the claim needs it {side} {threshold:g}.",
                  number, threshold)


def sensitivity_claim(tables: Mapping[str, pd.DataFrame]) -> Claim:
    rows = table_with(tables, ROWS, "perm_median_tvd")
    if rows is None:
        return _not_tested("sensitivity", "no permutation result in the rows table")
    small = (rows["perm_median_tvd"] < SMALL_TVD).astype(float).where(
        rows["perm_median_tvd"].notna())
    number = bootstrap_interval(small.to_numpy(), _examples(rows))
    return _threshold_claim("sensitivity", number, SENSITIVE_BELOW, True,
                            f"Share of rows whose median permutation TVD is below {SMALL_TVD}")


def top_key_claim(tables: Mapping[str, pd.DataFrame]) -> Claim:
    rows = table_with(tables, ROWS, "zero_top_flip")
    if rows is None or "zero_random_flip" not in rows.columns:
        return _not_tested("top_key_matters", "zeroing did not run")
    top = pd.to_numeric(rows["zero_top_flip"], errors="coerce").astype(float)
    other = pd.to_numeric(rows["zero_random_flip"], errors="coerce").astype(float)
    number = bootstrap_interval((top - other).to_numpy(), _examples(rows))
    return _threshold_claim("top_key_matters", number, TOP_FLIP_MARGIN, False,
                            "Top-key flip rate minus random-key flip rate")


def adversarial_claim(tables: Mapping[str, pd.DataFrame]) -> Claim:
    adversarial = table_with(tables, "adversarial", "eps_max_jsd")
    if adversarial is None:
        return _not_tested("unique_allocation", "the adversarial search did not run "
                           "(it runs in the full suite, not in --quick, where the work budget "
                           "buys it: the suite's adversarial_steps)")
    number = bootstrap_interval(adversarial["eps_max_jsd"].to_numpy(dtype=float),
                                _examples(adversarial))
    return _threshold_claim("unique_allocation", number, ADVERSARIAL_DIFFERENT, True,
                            "Mean eps-max JSD of the adversarial weights")


def _measure_intervals(table: pd.DataFrame) -> dict[str, Interval]:
    """measure -> its faithfulness number with the table's interval."""
    out = {}
    for row in table.to_dict("records"):
        low = float(row.get(f"{FAITHFULNESS}_low", float("nan")))
        high = float(row.get(f"{FAITHFULNESS}_high", float("nan")))
        counts = [float(row.get(name, 0)) for name in ("examples", "rows")]
        examples, rows = (int(c) if np.isfinite(c) else 0 for c in counts)
        out[str(row["measure"])] = Interval(float(row[FAITHFULNESS]), low, high, examples,
                                            rows)
    return out


def overlaps(a: Interval, b: Interval) -> bool:
    """Whether two intervals share a point (a tie); undefined intervals tie with anything."""
    if not (a.defined and b.defined):
        return True
    return a.low <= b.high and b.low <= a.high


def faithfulness_claims(tables: Mapping[str, pd.DataFrame]) -> list[Claim]:
    """above_random, rank_among_measures and most_faithful from ``faithfulness_summary``."""
    keys = ("above_random", "rank_among_measures", "most_faithful")
    table = table_with(tables, FAITHFULNESS_TABLE, FAITHFULNESS)
    if table is None:
        return [_not_tested(k, "the faithfulness protocol did not run, or measured no row "
                            "(its budget held none: the suite's faithfulness_budget)")
                for k in keys]
    found = _measure_intervals(table)
    weights, floor = found.get(WEIGHTS), found.get(FLOOR)
    measures = {m: i for m, i in found.items() if m != FLOOR and np.isfinite(i.estimate)}
    out = []
    if weights is None or floor is None:
        out.append(_not_tested("above_random", "no weights or random row in the "
                               "faithfulness table"))
    else:
        if not (weights.defined and floor.defined):
            status = INCONCLUSIVE
        elif weights.low > floor.high:
            status = SUPPORTED
        elif weights.high < floor.low:
            status = NOT_SUPPORTED
        else:
            status = INCONCLUSIVE
        out.append(_claim("above_random", status, f"AOPC comprehensiveness: weights {weights}"
                          f", random {floor}; the claim needs the weights' interval above "
                          "the random one (overlap: inconclusive).", weights, floor.high))
    if not measures:
        return [*out, *(_not_tested(k, "no measure in the faithfulness table")
                        for k in keys[1:])]
    best_name = max(measures, key=lambda m: measures[m].estimate)
    best = measures[best_name]
    ties = [m for m, i in measures.items() if m != best_name and overlaps(i, best)]
    order = sorted(measures, key=lambda m: -measures[m].estimate)
    ranking = "; ".join(f"{m} {measures[m]}" for m in order)
    if weights is None:
        out.append(_not_tested("rank_among_measures", "no weights row"))
    else:
        tied = best_name == WEIGHTS or WEIGHTS in ties
        rank_status = SUPPORTED if tied else NOT_SUPPORTED
        if not weights.defined or not best.defined:
            rank_status = INCONCLUSIVE
        out.append(_claim("rank_among_measures", rank_status,
                          f"Weights rank {order.index(WEIGHTS) + 1} of {len(order)} by AOPC "
                          f"comprehensiveness ({'tied with' if tied else 'below'} the best, "
                          f"{best_name}); overlapping intervals are ties. {ranking}.",
                          weights, best.low))
    most = (f"{best_name} (unique: no other interval overlaps it)" if not ties else
            f"{best_name}, tied with {', '.join(ties)} (overlapping intervals)")
    out.append(_claim("most_faithful", SUPPORTED if not ties else INCONCLUSIVE,
                      f"Most faithful by AOPC comprehensiveness: {most}.", best))
    return out


def _row(table: pd.DataFrame, measure: str) -> pd.Series | None:
    found = table[table["measure"] == measure]
    return None if found.empty else found.iloc[0]


def _why_not_computed(measures: pd.DataFrame | None) -> str:
    """' (measure: reason; ...)' from the contribution_measures table, or '' without it."""
    if measures is None or measures.empty:
        return ""
    missing = measures[measures["status"] != "computed"]
    return " (" + "; ".join(f"{r.measure}: {r.reason}" for r in missing.itertuples(index=False)
                            ) + ")" if len(missing) else ""


def contribution_claim(tables: Mapping[str, pd.DataFrame]) -> Claim:
    """The misconception "a larger score always means a larger final contribution" as a
    claim: supported (not refuted here) when the top-weight key and the top key of the
    first :data:`PREFERRED` contribution measure differ in fewer than MATERIAL_SHARE of the
    rows, interval included; not supported (refuted) from it up. A table without interval
    columns (audits written before them) is judged on the share alone."""
    table = tables.get(WEIGHTS_VS_CONTRIBUTIONS)
    weights = None if table is None or table.empty else _row(table, WEIGHTS)
    found = {} if weights is None or table is None else {
        m: row for m in PREFERRED if (row := _row(table, m)) is not None}
    if not found or weights is None:
        return _not_tested("top_key_contributes", "no contribution measure was computed"
                           + _why_not_computed(tables.get("contribution_measures")))
    name, best = next(iter(found.items()))
    column = "top_differs_from_weights"
    share = float(best[column])
    low = float(best.get(f"{column}_low", share))
    high = float(best.get(f"{column}_high", share))
    number = Interval(share, low, high, 0, int(best["rows"]))
    status = against(number, MATERIAL_SHARE, below=True) if np.isfinite(share) else NOT_TESTED
    others = [f"{m} {float(row[column]):.0%}" for m, row in found.items() if m != name]
    interval = f" [{low:.0%}, {high:.0%}]" if f"{column}_low" in best.index else ""
    text = (f"The key with the largest attention weight is not the key with the largest "
            f"{name} contribution in {share:.0%}{interval} of {int(best['rows'])} rows"
            f"{' (' + ', '.join(others) + ')' if others else ''}. The top-weight key is the "
            f"top leave-one-out key in {float(weights['top_is_loo_top']):.0%} of rows, the top "
            f"{name} key in {float(best['top_is_loo_top']):.0%}; mean Kendall tau with "
            f"leave-one-out: weights {float(weights['kendall_tau_vs_loo']):.3g}, {name} "
            f"{float(best['kendall_tau_vs_loo']):.3g}.")
    return _claim("top_key_contributes", status, text, number, MATERIAL_SHARE)


def headline(claims: list[Claim]) -> Claim:
    """The headline claim from the :data:`REQUIRED` ones (module docstring)."""
    required = [c for c in claims if c.key in REQUIRED]
    statuses = {c.status for c in required}
    def named(status: str) -> str:
        return "; ".join(f'"{c.question}"' for c in required if c.status == status)

    failing, untested, open_ = named(NOT_SUPPORTED), named(NOT_TESTED), named(INCONCLUSIVE)
    unmet = "; ".join(part for part in (
        f"inconclusive: {open_}" if open_ else "",
        f"not tested (never counted as met): {untested}" if untested else "") if part)
    if failing:
        status = NOT_SUPPORTED
        answer = f"Not supported: {failing}" + (f". Also {unmet}." if unmet else ".")
    elif statuses == {SUPPORTED}:
        status, answer = SUPPORTED, ("Supported by every claim tested; claims still hold only "
                                     "for the rows and interventions tested.")
    elif statuses == {NOT_TESTED}:
        status, answer = NOT_TESTED, "Not tested: no criterion ran."
    else:
        status, answer = INCONCLUSIVE, f"Inconclusive — {unmet}."
    return _claim(HEADLINE, status, answer)


CLAIMS: tuple[Callable[[Mapping[str, pd.DataFrame]], Claim | list[Claim]], ...] = (
    sensitivity_claim, top_key_claim, adversarial_claim, faithfulness_claims,
    contribution_claim)


def explanation_claims(tables: Mapping[str, pd.DataFrame]) -> list[Claim]:
    """The headline claim first, then every claim of :data:`QUESTIONS`, from the suite's
    tables by name."""
    claims: list[Claim] = []
    for make in CLAIMS:
        made = make(tables)
        claims.extend(made if isinstance(made, list) else [made])
    return [headline(claims), *claims]
