"""The work budget (attnaudit.interventions.work_budget): what it buys, counted here from the
model's parameters and the batch's shape; that a full suite under a small budget runs that
much (integrated gradients' points, the adversarial search's steps, a subset of the
faithfulness rows), says so in its metadata, and that its plan names what was left out and
counts what ran."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

import attnaudit
from attnaudit.attribution.loo import QUICK_LOO_MIN_EDITS, audit_edits, audit_window
from attnaudit.auditing.intervention_suite import run_suite
from attnaudit.checklist.claims import explanation_claims
from attnaudit.interventions.adversarial import CANDIDATES, LEAST_ADVERSARIAL_STEPS, STEPS
from attnaudit.interventions.work_budget import WORK_BUDGET, affordable
from attnaudit.targets.hf.loading import from_hf
from tests.helpers.tiny_causal import tiny_causal_checkpoint


def test_affordable_runs_all_that_fits_else_what_the_budget_buys():
    assert affordable(50, 10.0, 4, 1000.0) == 50  # 500 multiply-adds fit
    assert affordable(50, 100.0, 4, 1000.0) == 10
    assert affordable(50, 999.0, 4, 1000.0) == 4  # one fits; the least is 4
    assert affordable(3, 1e9, 4, 1.0) == 3  # never more than wanted
    assert affordable(50, 1e30, 4, math.inf) == 50


def test_leave_one_out_edits_under_the_budget():
    assert audit_edits(False, 1e11) is None  # no budget: every key alone
    assert audit_window(False, 1e11) == 1
    assert audit_edits(False, 1e11, 2e12) == 20
    assert audit_edits(False, 1e12, 2e12) == QUICK_LOO_MIN_EDITS  # 2 fit: the least
    window = audit_window(False, 1e11, 2e12)
    assert [window(n) for n in (5, 20, 21, 96)] == [1, 1, 2, 5]


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    folder, tokenizer = tiny_causal_checkpoint("gpt2", tmp_path_factory.mktemp("m") / "gpt2")
    prompts = ["w5 w6 w7 w8 w9 w10", "w9 w5 w6 w11 w12"]
    return lambda: from_hf(Path(folder), prompts, tokenizer=tokenizer, max_new_tokens=4)


def test_a_full_suite_under_a_small_budget_runs_what_it_buys(tiny_gpt2):
    target = tiny_gpt2()
    parameters = sum(p.numel() for p in target.model.parameters())
    batch = next(target.iter_batches(None))
    steps = int(target.greedy(batch).shape[1])
    sequence = parameters * (int(batch.source_ids.shape[1]) + steps)  # one edited sequence
    per_example = 30  # edited sequences' worth of multiply-adds per example
    budget = per_example * sequence
    points = per_example // (1 + steps)  # a forward pass and a backward pass per step
    assert points < 50
    suite = run_suite(target, quick=False, progress=False, n_permutations=2,
                      work_budget=budget)
    meta = suite.metadata
    assert meta["work_budget"] == budget
    assert f"({points} Gauss-Legendre points" in meta["attribution_variants"][
        "integrated_gradients"]
    measured, offered = map(int, meta["faithfulness_rows_measured"].split(" of "))
    assert 0 < measured < offered  # an example's rows take more than 30
    assert meta["faithfulness_forward_sequences"] <= per_example * 2
    assert meta["faithfulness_budget"].startswith("full: edited sources per example")
    # an Adam step: a forward and a backward one-token pass of each candidate of the rows
    rows_per_example = int(suite.tables["rows"].groupby("example").size().max())
    assert budget // (2 * CANDIDATES * rows_per_example * parameters) < LEAST_ADVERSARIAL_STEPS
    assert suite.tables["adversarial"].empty  # too short a search: none
    assert meta["adversarial_steps"].startswith("not run: ")
    claims = {c.key: c for c in explanation_claims(suite.tables)}
    assert claims["unique_allocation"].status == "not tested"

    plan = attnaudit.plan(tiny_gpt2(), work_budget=budget)
    text = str(plan)
    assert f"integrated gradients: {points} of 50 points" in text
    assert "adversarial: not run" in text
    # the plan counts rows by their bound, so no more than ran
    planned_rows = re.search(r"faithfulness: ~(\d+) of (\d+) rows", text)
    assert planned_rows is not None and int(planned_rows[2]) == offered
    assert int(planned_rows[1]) <= measured
    assert next(p for p in plan.protocols if p.name == "adversarial").cost.items == 0


def test_a_search_the_budget_shortens_runs_the_steps_it_buys(tiny_gpt2):
    target = tiny_gpt2()
    parameters = sum(p.numel() for p in target.model.parameters())
    steps = int(target.greedy(next(target.iter_batches(None))).shape[1])
    budget = 200 * 2 * CANDIDATES * steps * parameters  # 200 steps of a row per step
    suite = run_suite(target, quick=False, progress=False, n_permutations=2,
                      work_budget=budget)
    adversarial = suite.tables["adversarial"]
    rows_per_example = int(adversarial.groupby("example").size().max())
    adam_steps = int(budget // (2 * CANDIDATES * rows_per_example * parameters))
    assert LEAST_ADVERSARIAL_STEPS <= adam_steps < STEPS
    assert suite.metadata["adversarial_steps"].startswith(f"{adam_steps} of {STEPS} Adam steps")
    plan = attnaudit.plan(tiny_gpt2(), work_budget=budget)
    assert f"adversarial: {adam_steps} of {STEPS} steps" in str(plan)
    planned = next(p for p in plan.protocols if p.name == "adversarial")
    assert planned.cost.items == len(adversarial) * CANDIDATES * adam_steps


def test_no_budget_runs_the_papers_sizes(tiny_gpt2):
    plan = attnaudit.plan(tiny_gpt2(), work_budget=math.inf)
    assert "work budget" not in str(plan)
    adversarial = next(p for p in plan.protocols if p.name == "adversarial")
    assert adversarial.cost.items > 0 and adversarial.cost.items % (CANDIDATES * STEPS) == 0


def test_the_flag_reads_a_number_or_none():
    from attnaudit.cli.parser import build_parser
    from attnaudit.cli.settings import audit_options

    def parsed(*flags: str):
        return build_parser().parse_args(["report", "--out", "o", *flags])

    assert audit_options(parsed()).work_budget == WORK_BUDGET
    assert audit_options(parsed("--work-budget", "none")).work_budget == math.inf
    assert audit_options(parsed("--work-budget", "4e13")).work_budget == 4e13
    for bad in ("0", "-1", "lots"):
        with pytest.raises(SystemExit):
            parsed("--work-budget", bad)
