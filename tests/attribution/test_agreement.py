"""Rank agreement against hand-written tau-b, rank-formula Spearman and scipy, row by row."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import kendalltau, spearmanr

from attnaudit.attribution.agreement import (
    JAIN_WALLACE_REFERENCE,
    ROW_COLUMNS,
    SUMMARY_COLUMNS,
    agreement,
    beside_reference,
    rank_agreement,
    summarise_agreement,
)


def tau_b_by_hand(a: list[float], b: list[float]) -> float:
    """O(n^2) Kendall tau-b: (C - D) / sqrt((n0 - ties_a) (n0 - ties_b))."""
    concordant = discordant = ties_a = ties_b = 0
    for i, j in itertools.combinations(range(len(a)), 2):
        da, db = a[i] - a[j], b[i] - b[j]
        ties_a += da == 0
        ties_b += db == 0
        if da * db > 0:
            concordant += 1
        elif da * db < 0:
            discordant += 1
    n0 = len(a) * (len(a) - 1) // 2
    return (concordant - discordant) / math.sqrt((n0 - ties_a) * (n0 - ties_b))


def average_ranks(x: list[float]) -> list[float]:
    """1-based ranks; tied values share the mean of the ranks they span."""
    order = sorted(range(len(x)), key=lambda i: x[i])
    ranks = [0.0] * len(x)
    at = 0
    while at < len(x):
        end = at
        while end + 1 < len(x) and x[order[end + 1]] == x[order[at]]:
            end += 1
        for k in range(at, end + 1):
            ranks[order[k]] = (at + end) / 2 + 1
        at = end + 1
    return ranks


def spearman_by_hand(a: list[float], b: list[float]) -> float:
    """Without ties: 1 - 6 sum d^2 / (n (n^2 - 1)); with ties: Pearson of average ranks."""
    ra, rb = average_ranks(a), average_ranks(b)
    n = len(a)
    if len(set(a)) == n and len(set(b)) == n:
        return 1 - 6 * sum((x - y) ** 2 for x, y in zip(ra, rb, strict=True)) / (n * (n * n - 1))
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    return cov / math.sqrt(sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb))


@pytest.mark.parametrize("n", [2, 3, 5, 9, 20, 34])
@pytest.mark.parametrize("ties", [False, True])
def test_rank_statistics_match_hand_formulas_and_scipy(n: int, ties: bool) -> None:
    rng = np.random.default_rng(n)
    if ties:
        a, b = rng.integers(0, 3, (60, n)).astype(float), rng.integers(0, 4, (60, n)) / 7
    else:
        a, b = rng.random((60, n)), rng.random((60, n))
    b[:3] = a[:3] + 0.01 * rng.random((3, n)) * (not ties)  # near-identical rankings
    keep = (a.min(1) < a.max(1)) & (b.min(1) < b.max(1))
    a, b = a[keep], b[keep]
    got = rank_agreement(a, b, top_k=3)
    for i in range(len(a)):
        x, y = a[i].tolist(), b[i].tolist()
        assert got["kendall_tau"][i] == pytest.approx(tau_b_by_hand(x, y), abs=1e-12)
        assert got["spearman"][i] == pytest.approx(spearman_by_hand(x, y), abs=1e-12)
        tau, rho = kendalltau(x, y, variant="b"), spearmanr(x, y)
        assert got["kendall_p"][i] == pytest.approx(tau.pvalue, rel=1e-9, abs=1e-15)
        expected_p = 1.0 if n == 2 else rho.pvalue  # scipy has no p-value for two keys
        assert got["spearman_p"][i] == pytest.approx(expected_p, rel=1e-7, abs=1e-12)
        k = min(3, n)
        top_a = set(sorted(range(n), key=lambda j: (-x[j], j))[:k])
        top_b = set(sorted(range(n), key=lambda j: (-y[j], j))[:k])
        assert got["top_k_overlap"][i] == pytest.approx(len(top_a & top_b) / k)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.floats(-3, 3)), min_size=2, max_size=12))
def test_tau_is_symmetric_and_invariant_to_monotone_maps(pairs: list[tuple[int, float]]) -> None:
    a = np.array([[p[0] for p in pairs]], float)
    b = np.array([[p[1] for p in pairs]], float)
    if a.min() == a.max() or b.min() == b.max():
        return
    tau = rank_agreement(a, b, 2)["kendall_tau"][0]
    assert rank_agreement(b, a, 2)["kendall_tau"][0] == pytest.approx(tau, abs=1e-12)
    # exp on small integers and scaling by a power of two keep every order and tie exactly
    mapped = rank_agreement(np.exp(a), 4 * b, 2)["kendall_tau"][0]
    assert mapped == pytest.approx(tau, abs=1e-12)
    assert -1 <= tau <= 1


def importances_with_edge_rows() -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    keys = torch.tensor([[True] * 6, [True, True, True, True, False, False], [True] + [False] * 5])
    steps = torch.tensor([[True, True, True], [True, True, False], [True, True, True]])
    values = {name: torch.rand(3, 3, 6, generator=gen) for name in ("attention", "grad", "loo")}
    values["loo"][0, 1] = 0.25  # constant over the eligible keys
    values["attention"][1, 0, :4] = torch.tensor([0.4, 0.3, 0.2, 0.1])
    values["grad"][1, 0, :4] = torch.tensor([0.1, 0.2, 0.3, 0.4])  # reversed: tau = -1
    values["grad"][1, 0, 4:] = float("nan")  # ineligible keys are never read
    return values, keys, steps


def test_agreement_rows_and_exclusions() -> None:
    values, keys, steps = importances_with_edge_rows()
    rows = agreement(values, keys, steps, top_k=2)
    assert list(rows.columns) == ROW_COLUMNS
    assert len(rows) == 3 * int(steps.sum())
    pair = rows[(rows.method_a == "attention") & (rows.method_b == "grad")]
    assert pair[["example", "step"]].values.tolist() == steps.nonzero().tolist()
    reversed_row = pair[(pair.example == 1) & (pair.step == 0)].iloc[0]
    assert reversed_row.kendall_tau == pytest.approx(-1) and reversed_row.n_valid == 4
    assert reversed_row.top_k_overlap == 0
    assert (rows[rows.example == 2].excluded == "fewer than 2 eligible keys").all()
    with_loo = rows[rows.method_b == "loo"]
    constant = with_loo[(with_loo.example == 0) & (with_loo.step == 1)]
    assert (constant.excluded == "constant importance").all() and len(constant) == 2
    defined = rows[rows.excluded == ""]
    assert defined[["kendall_tau", "kendall_p", "spearman", "top_k_overlap"]].notna().all().all()
    assert rows[rows.excluded != ""].kendall_tau.isna().all()
    a = values["attention"][0, 2, :].tolist()
    b = values["loo"][0, 2, :].tolist()
    row = rows[(rows.method_b == "loo") & (rows.method_a == "attention") & (rows.example == 0)
               & (rows.step == 2)].iloc[0]
    assert row.kendall_tau == pytest.approx(tau_b_by_hand(a, b))


def test_keys_may_differ_by_step() -> None:
    values, keys, steps = importances_with_edge_rows()
    per_step = keys[:, None, :].repeat(1, 3, 1)
    pd.testing.assert_frame_equal(agreement(values, per_step, steps),
                                  agreement(values, keys, steps))
    per_step[0, 2, 3:] = False
    rows = agreement(values, per_step, steps, pairs=[("attention", "grad")])
    changed = rows[(rows.example == 0) & (rows.step == 2)].iloc[0]
    a, b = values["attention"][0, 2, :3].tolist(), values["grad"][0, 2, :3].tolist()
    assert changed.n_valid == 3
    assert changed.kendall_tau == pytest.approx(tau_b_by_hand(a, b))
    assert (rows[(rows.example == 0) & (rows.step < 2)].n_valid == 6).all()


def test_summary_counts_exclusions_and_has_no_nan() -> None:
    values, keys, steps = importances_with_edge_rows()
    rows = agreement(values, keys, steps, pairs=[("attention", "grad"), ("grad", "loo")])
    summary = summarise_agreement(rows)
    assert list(summary.columns) == SUMMARY_COLUMNS
    assert not summary.isna().any().any()
    for _, line in summary.iterrows():
        group = rows[(rows.method_a == line.method_a) & (rows.method_b == line.method_b)]
        defined = group[group.excluded == ""]
        taus = defined.kendall_tau.to_numpy()
        assert line.n == len(taus) and line.n_excluded == len(group) - len(taus)
        assert line.kendall_tau_mean == pytest.approx(np.mean(taus))
        assert line.kendall_tau_std == pytest.approx(np.std(taus, ddof=1))
        assert line.sig_frac == pytest.approx(np.mean(defined.kendall_p.to_numpy() <= 0.05))
        assert line.spearman_mean == pytest.approx(defined.spearman.mean())
    grad_loo = summary[summary.method_a == "grad"].iloc[0]
    assert grad_loo.n_excluded == 4  # example 2 (three steps, one key) and the constant row


def test_a_pair_without_defined_rows_has_no_summary_row() -> None:
    keys = torch.tensor([[True, False, False]])
    steps = torch.tensor([[True, True]])
    values = {"a": torch.rand(1, 2, 3), "b": torch.rand(1, 2, 3)}
    rows = agreement(values, keys, steps)
    assert (rows.excluded == "fewer than 2 eligible keys").all()
    assert summarise_agreement(rows).empty


def test_reference_values_printed_beside_ours() -> None:
    values, keys, steps = importances_with_edge_rows()
    table = beside_reference(summarise_agreement(agreement(values, keys, steps)), "toy")
    ours = table[table.source == "attnaudit"]
    assert len(ours) == 3 and (ours.kendall_tau_low == ours.kendall_tau_high).all()
    reference = table[table.source != "attnaudit"].set_index("dataset")
    assert reference.loc["SST", "kendall_tau_low"] == 0.35
    assert reference.loc["CNN", "kendall_tau_high"] == 0.24
    assert tuple(reference.loc["typical", ["kendall_tau_low", "kendall_tau_high"]]) == (0.5, 0.7)
    assert set(JAIN_WALLACE_REFERENCE.dataset) == {"SST", "IMDB", "AG News", "SNLI", "CNN",
                                                   "typical"}
    assert not table.isna().any().any()


def test_bad_inputs_give_clear_errors() -> None:
    values, keys, steps = importances_with_edge_rows()
    with pytest.raises(ValueError, match=r"expected \(B, T, n\)"):
        agreement({**values, "bad": torch.zeros(3, 3)}, keys, steps)
    with pytest.raises(ValueError, match="keys must be bool"):
        agreement(values, keys.float(), steps)
    with pytest.raises(ValueError, match="pairs must name"):
        agreement(values, keys, steps, pairs=[("attention", "nope")])
    with pytest.raises(ValueError, match="at least two"):
        agreement({"attention": values["attention"]}, keys, steps)
    with pytest.raises(ValueError, match="top_k"):
        agreement(values, keys, steps, top_k=0)
    with pytest.raises(ValueError, match="missing columns"):
        summarise_agreement(pd.DataFrame({"method_a": []}))


def test_non_finite_importance_excludes_its_rows_and_counts_them() -> None:
    """Leave-one-out of a key the model cannot do without may give NaN: those rows are
    counted apart, the others keep exactly the numbers they had."""
    values, keys, steps = importances_with_edge_rows()
    clean = agreement(values, keys, steps)
    values["loo"][0, 2, 3] = float("nan")  # an eligible key of a counted row
    values["loo"][2, 0, 0] = float("nan")  # the only key of a row with one eligible key
    rows = agreement(values, keys, steps)
    hit = (rows.example == 0) & (rows.step == 2) & (rows.method_b == "loo")
    assert (rows[hit].excluded == "non-finite loo").all() and hit.sum() == 2
    assert (rows[(rows.example == 2)].excluded == "fewer than 2 eligible keys").all()
    pd.testing.assert_frame_equal(rows[~hit], clean[~hit])
    summary = summarise_agreement(rows).set_index(["method_a", "method_b"])
    assert summary.loc[("attention", "loo"), "n_excluded"] == (
        summarise_agreement(clean).set_index(["method_a", "method_b"])
        .loc[("attention", "loo"), "n_excluded"] + 1)
    assert not summary.isna().any().any()
