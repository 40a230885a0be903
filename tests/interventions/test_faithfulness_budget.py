"""The quick faithfulness budget: which rows it measures (against a count of edited sources
written here with Python sets), that a budgeted run's rows equal the same rows of an
unbudgeted run, and that a budget holding no row leaves the claims "not tested"."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from attnaudit.auditing import faithfulness_protocol
from attnaudit.auditing.intervention_suite import run_suite
from attnaudit.checklist.claims import faithfulness_claims
from attnaudit.interventions.faithfulness import FRACTIONS, rows_within
from attnaudit.interventions.reference_run import RowIndex
from attnaudit.targets.hf.loading import from_hf
from tests.helpers.tiny_causal import tiny_causal_checkpoint


def edited_sets(eligible: list[int], orders: list[list[int]]) -> set[frozenset[int]]:
    """One row's edited sources as sets of removed keys: per ordering and bin, the top k and
    the eligible keys but the top k."""
    n = len(eligible)
    out = set()
    for order in orders:
        ranked = [k for k in order if k in eligible]
        for f in FRACTIONS:
            k = min(n, max(1, math.ceil(f * n / 100)))
            out.add(frozenset(ranked[:k]))
            out.add(frozenset(eligible) - frozenset(ranked[:k]))
    return out


@pytest.mark.parametrize("budget", [0, 7, 15, 40, 1000, None])
def test_rows_within_takes_each_examples_rows_in_seeded_order_while_they_fit(budget):
    gen = torch.Generator().manual_seed(3)
    example = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    rows = RowIndex(example, torch.tensor([0, 1, 2, 3, 0, 1, 2]))
    n_keys, n_orders = 9, 3
    eligible = torch.rand(len(example), n_keys, generator=gen) < 0.8
    eligible[:, 0] = True
    orders = torch.stack([torch.stack([torch.randperm(n_keys, generator=gen)
                                       for _ in range(n_orders)]) for _ in example])
    seeds = [11, 12, 13, 14, 21, 22, 23]
    expected = []
    for e in (0, 1):
        members = [i for i in range(len(example)) if int(example[i]) == e]
        if budget is None:
            expected += members
            continue
        perm = torch.randperm(len(members), generator=torch.Generator().manual_seed(
            seeds[members[0]])).tolist()
        seen: set[frozenset[int]] = set()
        for i in [members[p] for p in perm]:
            keys = eligible[i].nonzero().squeeze(1).tolist()
            new = edited_sets(keys, orders[i].tolist()) - seen
            if len(seen) + len(new) > budget:
                break
            seen |= new
            expected.append(i)
    kept = rows_within(rows, eligible, orders, budget, seeds)
    assert kept.tolist() == sorted(expected)


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    folder, tokenizer = tiny_causal_checkpoint("gpt2", tmp_path_factory.mktemp("m") / "gpt2")
    prompts = ["w5 w6 w7 w8 w9 w10", "w9 w5 w6 w11 w12"]
    return lambda: from_hf(Path(folder), prompts, tokenizer=tokenizer, max_new_tokens=4)


def quick_suite(target, per_example: int, multiply_adds: float, monkeypatch):
    monkeypatch.setattr(faithfulness_protocol, "QUICK_SEQUENCES_PER_EXAMPLE", per_example)
    monkeypatch.setattr(faithfulness_protocol, "QUICK_MULTIPLY_ADDS", multiply_adds)
    return run_suite(target, quick=True, progress=False, n_permutations=2)


def test_a_budget_measures_a_subset_of_rows_with_the_unbudgeted_values(tiny_gpt2,
                                                                        monkeypatch):
    every = quick_suite(tiny_gpt2(), 10**6, 0.0, monkeypatch)
    some = quick_suite(tiny_gpt2(), 30, 0.0, monkeypatch)
    all_rows, rows = every.tables["faithfulness_rows"], some.tables["faithfulness_rows"]
    offered = all_rows[["example", "step"]].drop_duplicates()
    measured = rows[["example", "step"]].drop_duplicates()
    assert 0 < len(measured) < len(offered)
    assert some.metadata["faithfulness_rows_measured"] == f"{len(measured)} of {len(offered)}"
    assert every.metadata["faithfulness_rows_measured"] == f"{len(offered)} of {len(offered)}"
    # 30 edited sources per audited example, two examples, both measured
    assert some.metadata["faithfulness_forward_sequences"] <= 30 * 2
    assert "30 per measured example" in some.metadata["faithfulness_budget"]
    joined = rows.merge(all_rows, on=["example", "step", "measure"], suffixes=("", "_all"))
    assert len(joined) == len(rows)
    for column in ("aopc_comprehensiveness", "aopc_sufficiency", "p_full"):
        np.testing.assert_allclose(joined[column], joined[f"{column}_all"], atol=1e-6)


def test_a_budget_that_holds_no_row_leaves_the_claims_not_tested(tiny_gpt2, monkeypatch):
    suite = quick_suite(tiny_gpt2(), 1, 0.0, monkeypatch)
    assert suite.tables["faithfulness_rows"].empty
    assert suite.metadata["faithfulness_rows_measured"].startswith("0 of ")
    claims = faithfulness_claims(suite.tables)
    assert {c.status for c in claims} == {"not tested"}
    assert all("budget" in c.answer for c in claims)


def test_full_mode_without_a_work_budget_measures_every_row():
    settings = SimpleNamespace(quick=False, work_budget=math.inf)
    full = SimpleNamespace(settings=settings, sequence_multiply_adds=lambda: 1e9,
                           rows=SimpleNamespace(example=torch.tensor([0, 0, 1])))
    assert faithfulness_protocol.budget_per_example(full, [10, 10, 10]) is None
    assert faithfulness_protocol.budget_text(settings, {}).startswith("none")
    # a budget every example's rows fit is no budget: 20 edited sources of 1e9 each
    settings.work_budget = 2e10
    assert faithfulness_protocol.budget_per_example(full, [10, 10, 10]) is None
    assert faithfulness_protocol.budget_per_example(full, [10, 11, 10]) == 20
    held = {"rows_offered": 3, "rows_measured": 3}
    assert faithfulness_protocol.budget_text(settings, held).startswith(
        "full: every row of every example")
    some = {"rows_offered": 3, "rows_measured": 2, "budget": 20}
    assert "; 20 per measured example" in faithfulness_protocol.budget_text(settings, some)


def test_the_plan_counts_the_rows_the_budget_holds(tiny_gpt2, monkeypatch):
    """The plan's faithfulness items under the quick budget: none where one row does not
    fit (the 1B-shaped model's case), at most the budget where some rows do, and the
    unbudgeted bound where every row does; at least the edited sources the audit runs."""
    import attnaudit

    def planned(per_example: int) -> int:
        monkeypatch.setattr(faithfulness_protocol, "QUICK_SEQUENCES_PER_EXAMPLE", per_example)
        monkeypatch.setattr(faithfulness_protocol, "QUICK_MULTIPLY_ADDS", 0.0)
        plan = attnaudit.plan(tiny_gpt2(), quick=True)
        return next(p for p in plan.protocols if p.name == "faithfulness").cost.items

    assert planned(1) == 0
    every = planned(10**6)
    assert 0 < planned(30) <= 30 * 2 < every
    ran = quick_suite(tiny_gpt2(), 10**6, 0.0, monkeypatch)
    assert ran.metadata["faithfulness_forward_sequences"] <= every

