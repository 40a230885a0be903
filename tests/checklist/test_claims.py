"""The explanation verdict's claims on hand-built tables whose answers follow by hand from
the thresholds: whole intervals on one side (supported / not supported), intervals across
the threshold (inconclusive), criteria that did not run (not tested, never met)."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from attnaudit.analysis.bootstrap import BOOTSTRAP_SEED
from attnaudit.auditing.intervention_suite import summary_table
from attnaudit.checklist import (
    FAIL,
    NOT_RECORDED,
    PASS,
    WARN,
    explanation_claims,
    explanation_status,
)
from attnaudit.checklist.claims import (
    ADVERSARIAL_DIFFERENT,
    HEADLINE,
    MATERIAL_SHARE,
    REQUIRED,
    SENSITIVE_BELOW,
    headline,
)
from attnaudit.checklist.contributions import larger_score_judgement
from attnaudit.checklist.items import (
    INCONCLUSIVE,
    NOT_SUPPORTED,
    NOT_TESTED,
    SUPPORTED,
    Claim,
)
from attnaudit.interventions.permutation import SMALL_TVD
from attnaudit.interventions.protocols import AdversarialSearch, Permutation, Uniform

EXAMPLES = 10  # two rows (steps) each


def rows(insensitive_examples: int, top_flips: bool = True) -> pd.DataFrame:
    """The suite's per-row table: the first ``insensitive_examples`` examples have both rows
    below SMALL_TVD, the others well above; zeroing the top key flips (or not), a random
    key never does."""
    example = np.repeat(np.arange(EXAMPLES), 2)
    tvd = np.where(example < insensitive_examples, SMALL_TVD / 10, 0.4)
    return pd.DataFrame({"example": example, "step": np.tile([0, 1], EXAMPLES),
                         "n_valid": 5, "max_attention": 0.6, "perm_median_tvd": tvd,
                         "zero_top_flip": top_flips, "zero_random_flip": False})


def by_key(tables: dict[str, pd.DataFrame]) -> dict[str, Claim]:
    return {c.key: c for c in explanation_claims(tables)}


def faithfulness(**measures: tuple[float, float, float]) -> pd.DataFrame:
    return pd.DataFrame([{"measure": m, "examples": EXAMPLES, "rows": 2 * EXAMPLES,
                          "aopc_comprehensiveness": e, "aopc_comprehensiveness_low": lo,
                          "aopc_comprehensiveness_high": hi}
                         for m, (e, lo, hi) in measures.items()])


CONTRIBUTION_COLUMNS = ["measure", "reading", "rows", "top_differs_from_weights",
                        "top_differs_from_weights_low", "top_differs_from_weights_high",
                        "top_is_loo_top", "kendall_tau_vs_loo", "top_k_overlap_vs_loo"]


def contributions(share: float, low: float, high: float) -> pd.DataFrame:
    return pd.DataFrame([["weights", "w", 20, 0.0, 0.0, 0.0, 0.5, 0.3, 0.6],
                         ["alti", "a", 20, share, low, high, 0.7, 0.4, 0.7]],
                        columns=CONTRIBUTION_COLUMNS)


def test_sensitivity_from_the_share_and_its_interval():
    # no insensitive example: the share is 0 in every replicate, wholly below 0.5
    claim = by_key({"rows": rows(0)})["sensitivity"]
    assert (claim.status, claim.estimate, claim.low, claim.high) == (SUPPORTED, 0, 0, 0)
    assert claim.threshold == SENSITIVE_BELOW and claim.examples == EXAMPLES
    assert by_key({"rows": rows(EXAMPLES)})["sensitivity"].status == NOT_SUPPORTED
    # half the examples: replicates k/10 with k ~ Binomial(10, 1/2) straddle 0.5
    half = by_key({"rows": rows(EXAMPLES // 2)})["sensitivity"]
    assert half.estimate == 0.5 and half.low < SENSITIVE_BELOW < half.high
    assert half.status == INCONCLUSIVE
    # one example has no interval: however clear its rows, the claim stays open
    one = rows(0).query("example == 0")
    assert by_key({"rows": one})["sensitivity"].status == INCONCLUSIVE
    assert by_key({})["sensitivity"].status == NOT_TESTED


def test_zeroing_the_top_key_must_beat_a_random_key():
    assert by_key({"rows": rows(0, top_flips=True)})["top_key_matters"].status == SUPPORTED
    # flips as rare as a random key's: the difference is 0 everywhere, not above 0
    assert by_key({"rows": rows(0, top_flips=False)})["top_key_matters"].status == \
        NOT_SUPPORTED


def test_the_adversarial_criterion_is_not_tested_when_it_did_not_run():
    claims = by_key({"rows": rows(0)})
    assert claims["unique_allocation"].status == NOT_TESTED
    found = pd.DataFrame({"example": [0, 1, 2, 3], "eps_max_jsd": [0.3, 0.4, 0.5, 0.35]})
    assert by_key({"adversarial": found})["unique_allocation"].status == NOT_SUPPORTED
    none_found = found.assign(eps_max_jsd=[0.0, 0.01, 0.02, 0.0])
    assert by_key({"adversarial": none_found})["unique_allocation"].status == SUPPORTED
    across = found.assign(eps_max_jsd=[0.0, 0.3, 0.0, 0.3])  # mean 0.15, replicates 0..0.3
    assert by_key({"adversarial": across})["unique_allocation"].status == INCONCLUSIVE
    assert ADVERSARIAL_DIFFERENT == 0.1


def everything_supported() -> dict[str, pd.DataFrame]:
    """Tables on which every claim is supported, adversarial search included."""
    return {"rows": rows(0),
            "adversarial": pd.DataFrame({"example": [0, 1, 2], "eps_max_jsd": 0.0}),
            "faithfulness_summary": faithfulness(weights=(0.5, 0.45, 0.55),
                                                 rollout=(0.3, 0.25, 0.35),
                                                 random=(0.1, 0.05, 0.15)),
            "weights_vs_contributions": contributions(0.0, 0.0, 0.0)}


def test_quick_cannot_pass_a_criterion_it_skipped():
    tables = everything_supported()
    claims = by_key(tables)
    assert claims[HEADLINE].status == SUPPORTED
    assert explanation_status(tables) == PASS
    # --quick: no adversarial table. Every other claim is still supported, yet the
    # headline is not: the skipped criterion is "not tested", never met.
    quick = {k: v for k, v in tables.items() if k != "adversarial"}
    claims = by_key(quick)
    assert claims["unique_allocation"].status == NOT_TESTED
    assert claims[HEADLINE].status == INCONCLUSIVE
    assert claims[HEADLINE].answer.startswith("Inconclusive — not tested (never counted as "
                                              'met): "No very different weights')
    assert explanation_status(quick) == WARN
    # nor the faithfulness protocol, when it did not run
    no_faith = {k: v for k, v in tables.items() if k != "faithfulness_summary"}
    assert by_key(no_faith)[HEADLINE].status == INCONCLUSIVE


def test_faithfulness_against_the_floor_and_the_other_measures():
    claims = by_key({"faithfulness_summary": faithfulness(
        weights=(0.30, 0.25, 0.35), rollout=(0.32, 0.28, 0.36),
        saliency=(0.10, 0.07, 0.13), random=(0.05, 0.02, 0.08))})
    assert claims["above_random"].status == SUPPORTED  # 0.25 above 0.08
    # rollout has the highest AOPC, but the weights' interval overlaps it: a tie
    assert claims["rank_among_measures"].status == SUPPORTED
    assert "rank 2 of 3" in claims["rank_among_measures"].answer
    assert claims["most_faithful"].status == INCONCLUSIVE
    assert "rollout, tied with weights" in claims["most_faithful"].answer

    claims = by_key({"faithfulness_summary": faithfulness(
        weights=(0.01, 0.0, 0.02), saliency=(0.40, 0.35, 0.45), random=(0.05, 0.03, 0.08))})
    assert claims["above_random"].status == NOT_SUPPORTED  # 0.02 below 0.03
    assert claims["rank_among_measures"].status == NOT_SUPPORTED
    assert claims["most_faithful"].status == SUPPORTED
    assert "saliency (unique" in claims["most_faithful"].answer

    overlap = by_key({"faithfulness_summary": faithfulness(
        weights=(0.06, 0.03, 0.09), random=(0.05, 0.02, 0.08))})
    assert overlap["above_random"].status == INCONCLUSIVE
    assert by_key({})["above_random"].status == NOT_TESTED


def test_weights_vs_contributions_is_a_claim_and_the_judgement_reads_it():
    refuted = {"weights_vs_contributions": contributions(0.29, 0.2, 0.38)}
    assert by_key(refuted)["top_key_contributes"].status == NOT_SUPPORTED
    assert larger_score_judgement(refuted)[0] == "refuted"
    assert "29% [20%, 38%] of 20 rows" in larger_score_judgement(refuted)[1]
    across = {"weights_vs_contributions": contributions(0.04, 0.01, 0.07)}
    assert by_key(across)["top_key_contributes"].status == INCONCLUSIVE
    assert larger_score_judgement(across)[0] == "inconclusive"
    agree = {"weights_vs_contributions": contributions(0.0, 0.0, 0.0)}
    assert larger_score_judgement(agree)[0] == "not refuted here"
    assert MATERIAL_SHARE == 0.05


def test_the_verdict_cannot_disagree_with_weights_vs_contributions():
    tables = everything_supported()
    tables["weights_vs_contributions"] = contributions(0.29, 0.2, 0.38)
    claims = by_key(tables)
    assert claims[HEADLINE].status == NOT_SUPPORTED
    assert claims[HEADLINE].answer == ('Not supported: "The key with the largest weight is '
                                       'the largest contributor".')
    assert explanation_status(tables) == FAIL


@pytest.mark.parametrize("statuses", list(itertools.product(
    (SUPPORTED, NOT_SUPPORTED, INCONCLUSIVE, NOT_TESTED), repeat=3)))
def test_the_headline_is_supported_only_when_every_required_claim_is(statuses):
    nan = float("nan")
    rest = [SUPPORTED] * (len(REQUIRED) - len(statuses))
    claims = [Claim(key, key, status, "", nan, nan, nan, nan, 0)
              for key, status in zip(REQUIRED, (*statuses, *rest), strict=True)]
    top = headline(claims).status
    assert (top == SUPPORTED) == all(s == SUPPORTED for s in statuses)
    assert (top == NOT_SUPPORTED) == (NOT_SUPPORTED in statuses)


def test_no_table_is_not_recorded():
    assert explanation_status({}) == NOT_RECORDED
    assert by_key({})[HEADLINE].status == NOT_TESTED


def test_intervals_are_reproducible_with_the_seed():
    tables = {"rows": rows(EXAMPLES // 2).assign(perm_flip_rate=0.1, uniform_tvd=0.2,
                                                 uniform_flip=[True, False] * EXAMPLES),
              "adversarial": pd.DataFrame({"example": [0, 1, 2, 3],
                                           "eps_max_jsd": [0.0, 0.3, 0.1, 0.2]})}
    first, again = explanation_claims(tables), explanation_claims(tables)
    bounds = [(c.low, c.high) for c in first if np.isfinite(c.low)]
    assert len(bounds) == 3 and bounds == [(c.low, c.high) for c in again
                                           if np.isfinite(c.low)]
    protocols = (Permutation(), Uniform(), AdversarialSearch())
    table = summary_table([r for p in protocols for r in p.summary(tables)])
    assert table.columns.tolist() == ["metric", "value", "n", "variant", "value_low",
                                      "value_high"]
    assert table.equals(summary_table([r for p in protocols for r in p.summary(tables)]))
    share = table.set_index("metric").loc["perm_small_tvd_share"]
    small = (tables["rows"]["perm_median_tvd"] < SMALL_TVD).to_numpy()
    # the same number from the documented generator: seed 0, 1000 resamples of the examples
    draws = np.random.default_rng(BOOTSTRAP_SEED).integers(0, EXAMPLES, (1000, EXAMPLES))
    per_example = small.reshape(EXAMPLES, 2).mean(1)
    replicates = per_example[draws].mean(1)
    assert (share["value_low"], share["value_high"]) == pytest.approx(
        tuple(np.quantile(replicates, [0.025, 0.975])))
    assert share["value"] == 0.5 and share["n"] == 2 * EXAMPLES
    # the example-mean TVD: a constant per example, so its interval is that constant
    tvd = table.set_index("metric").loc["uniform_tvd"]
    assert (tvd["value"], tvd["value_low"], tvd["value_high"]) == pytest.approx((0.2,) * 3)
