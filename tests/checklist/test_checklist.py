"""Checklist logic on hand-built inputs with known answers."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from torch import nn

from attnaudit.checklist import (
    FAIL,
    NOT_RECORDED,
    PASS,
    WARN,
    explanation_status,
    parameter_table,
    worst,
)
from attnaudit.checklist.items import NOT_SUPPORTED, NOT_TESTED


def test_worst_orders_statuses():
    assert worst([]) == NOT_RECORDED
    assert worst([NOT_RECORDED, PASS]) == PASS
    assert worst([PASS, WARN, PASS]) == WARN
    assert worst([WARN, FAIL]) == FAIL
    with pytest.raises(ValueError, match="unknown status"):
        worst(["maybe"])


def _perm(tvds, max_attention=0.9):
    return pd.DataFrame({"max_attention": [max_attention] * len(tvds),
                         "perm_median_tvd": tvds})


def test_explanation_status_reads_the_suite_tables_by_name():
    # the headline claim as a checklist status (tests/checklist/test_claims.py has the cases)
    assert explanation_status({}) == NOT_RECORDED
    assert explanation_status({"other": pd.DataFrame({"x": [1]})}) == NOT_RECORDED
    insensitive = _perm([0.0, 0.01, 0.02, 0.0])
    no_flips = insensitive.assign(uniform_tvd=0.0, uniform_flip=False)
    assert explanation_status({"rows": no_flips}) == FAIL
    # tables are read by name: the same columns under another name are not the suite's rows
    assert explanation_status({"p": no_flips}) == NOT_RECORDED


def test_parameter_table_reports_tied_tensors():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.k_proj = nn.Linear(4, 4, bias=False)
            self.v_proj = nn.Linear(4, 4, bias=False)
            self.v_proj.weight = self.k_proj.weight  # keys and values share one projection

    model = nn.Sequential()
    model.add_module("attn", Tied())
    table = parameter_table(model, {"attn:self": "attn"})
    # named_parameters() lists a shared tensor once, under its first name.
    assert table["parameter"].tolist() == ["attn.k_proj.weight"]
    assert table["shared_with"].tolist() == ["attn.v_proj.weight"]
    assert table["shape"].tolist() == ["4x4"]
    assert torch.equal(model.attn.k_proj.weight, model.attn.v_proj.weight)


def test_intervention_tables_become_observations_and_figures():
    from attnaudit.auditing.intervention_suite import InterventionSuite
    from attnaudit.checklist import build_checklist
    from attnaudit.report.item_figures import item_figures

    rows = _perm([0.3, 0.5, 0.01, 0.2], max_attention=0.8).assign(
        uniform_tvd=[0.2, 0.4, 0.2, 0.4], uniform_flip=[True, False, True, False],
        zero_top_flip=True, zero_random_flip=[False, True, False, True],
        value_zero_tvd=0.1, value_zero_flip=True, value_mean_tvd=0.3)
    tables = {
        "rows": rows,
        "cumulative_summary": pd.DataFrame({"order": ["attention", "random"], "n": [2, 10],
                                            "n_flipped": [2, 5], "never_flipped": [0, 5],
                                            "frac_keys_median": [0.1, 0.5]}),
        "adversarial": pd.DataFrame({"eps_max_jsd": [0.2, 0.4]}),
        "agreement_summary": pd.DataFrame({"method_a": ["attention"], "method_b": ["saliency"],
                                           "n": [4], "kendall_tau_mean": [0.25],
                                           "sig_frac": [0.5]}),
        "agreement": pd.DataFrame({"method_a": "attention", "method_b": "saliency",
                                   "example": [0, 0, 1, 1], "step": [0, 1, 0, 1],
                                   "kendall_tau": [0.1, 0.2, 0.3, 0.4]}),
    }
    checklist = build_checklist(nn.Linear(1, 1), None, InterventionSuite(tables, {}),
                                audit_reason="not run in this test")
    item = checklist.item("interventions")
    # 3 of 4 rows change by TVD >= 0.05 and the top key flips 100 % vs 50 %, but the
    # adversarial search found very different weights with the same output (0.2 and 0.4,
    # both above ADVERSARIAL_DIFFERENT = 0.1): that claim is not supported, so neither is
    # the headline (the old rule called this warn).
    assert item.status == FAIL
    text = " ".join(item.observations)
    for expected in ("25% of 4 rows", "flips in 50% of 4 rows", "top-weighted key flips the "
                     "argmax in 100% of rows; zeroing a random other eligible key in 50%",
                     "attention: median 0.1 of the keys (0 of 2 never flipped)",
                     "zero: mean TVD 0.1, flips 100%; mean: mean TVD 0.3",
                     "Adversarial attention (2 rows): eps-max JSD median 0.3, mean 0.3",
                     "attention vs saliency: 0.25"):
        assert expected in text, expected
    assert [n for n in checklist.tables()] == list(tables)
    assert checklist.verdicts[0].status == NOT_RECORDED
    assert checklist.verdicts[1].status == NOT_SUPPORTED
    claims = {c.key: c.status for c in checklist.verdicts[1].claims}
    assert claims["unique_allocation"] == NOT_SUPPORTED
    assert claims["above_random"] == NOT_TESTED  # no faithfulness table
    assert checklist.summary_tables()["claims"]["claim"].tolist() == list(claims)
    assert all(r.status == NOT_RECORDED for r in checklist.items[:-1])
    names = [f.name for f in item_figures(checklist.all_tables(), None, None)["interventions"]]
    assert names == ["permutation_tvd", "agreement"]
