"""The gate's row-sum tolerance follows the weights' dtype: healthy reduced-precision models
pass, faulty ones fail in every dtype, a tolerance the user gives still wins."""

from __future__ import annotations

import math

import pytest
import torch

import attnaudit
import attnaudit.cli
from attnaudit.analysis.numerics import row_sum_tolerance
from attnaudit.targets.placement import place
from attnaudit.validity.pipeline import run_validity_audit
from tests.helpers.toys.masking import make_target

DTYPES = ["float32", "bfloat16", "float16"]
FAULTS = {  # masking -> the gate check that must fail
    "after_softmax": "masked_mass",
    "zero_fill": "masked_mass",
    "wrong_axis": "softmax_axis",
    "wrong_axis_tapped": "row_sum",
    "nan_on_empty_source": "all_masked_nan",
}


def _audit(masking: str, dtype: str, **options):
    sources = None
    if masking == "nan_on_empty_source":
        masking, sources = "correct", ([3, 4, 5, 6, 7], [5, 3], [])
    target = make_target(masking, **({} if sources is None else {"sources": sources}))
    target = place(target, dtype=dtype)
    assert target.model.out.weight.dtype == getattr(torch, dtype)
    return run_validity_audit(target, progress=False, keep_example=False, regions=False,
                              timing=False, **options)


def _failing(audit) -> set[str]:
    return {f.check for f in audit.findings() if f.status == "fail"}


@pytest.mark.parametrize("dtype", DTYPES)
def test_healthy_toy_passes_in_every_dtype(dtype):
    audit = _audit("correct", dtype)
    assert _failing(audit) == set()
    assert set(audit.sites["weights_dtype"]) == {dtype}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("masking", list(FAULTS))
def test_faulty_toys_fail_in_every_dtype(masking, dtype):
    assert FAULTS[masking] in _failing(_audit(masking, dtype))


def test_rule_is_unit_roundoff_times_summation_depth():
    for dtype, unit in ((torch.bfloat16, 2.0**-8), (torch.float16, 2.0**-11)):
        for keys in (1, 2, 40, 1024):
            expected = max(1e-3, unit * (1 + math.ceil(math.log2(keys))))
            assert row_sum_tolerance(dtype, keys) == pytest.approx(expected)
    assert row_sum_tolerance(torch.float32, 4096) == 1e-3
    assert row_sum_tolerance(torch.float64, 10) == 1e-3


def test_hf_model_in_bfloat16_passes_the_gate_and_a_given_tolerance_wins(capsys):
    pytest.importorskip("transformers")
    base = ["check", "--hf", "examples/date_transformer/model", "--data",
            "examples/date_transformer/audit.tsv", "--limit", "8", "--dtype", "bfloat16"]
    assert attnaudit.cli.main([*base, "--json"]) == 0
    out = capsys.readouterr().out
    assert '"weights_dtype": "bfloat16"' in out and '"row_sum_tolerance": null' in out
    # bf16's own rounding is above the float32 tolerance: the fixed 1e-3 would fail it
    assert attnaudit.cli.main([*base, "--row-sum-tolerance", "1e-3"]) == 1
    assert "row_sum" in capsys.readouterr().out


def test_checks_only_audit_runs_just_what_the_gate_judges():
    full = _audit("zero_fill", "float32")
    light = _audit("zero_fill", "float32", checks_only=True)
    metrics = set(light.metrics["metric"])
    assert "masked_mass" in metrics and "row_sum_error" in metrics
    assert not metrics & {"entropy", "score_min", "output_norm"}
    assert {"entropy", "score_min"} <= set(full.metrics["metric"])
    assert not light.sites["scores_available"].any()  # capture kept no scores
    assert [(f.site, f.check, f.status, f.rows) for f in light.findings()] == [
        (f.site, f.check, f.status, f.rows) for f in full.findings()]


ERROR = 18 / 1024  # 0.0176, a bfloat16 number: rows below sum to 1 + ERROR exactly


class TappedRows(torch.nn.Module):
    """Taps bfloat16 rows (1, 1, Q, K >= 8): 1/8 on each of the first 8 keys and ERROR more
    on the last, so each row sums to 1 + ERROR exactly."""

    def __init__(self, queries: int, keys: int) -> None:
        super().__init__()
        self.shape = (1, 1, queries, keys)

    def forward(self) -> torch.Tensor:
        rows = torch.zeros(self.shape, dtype=torch.bfloat16)
        rows[..., :8] = 0.125
        rows[..., -1] += ERROR
        return attnaudit.tap("rows", rows, kind="cross")


@pytest.mark.parametrize(("queries", "keys", "passes"), [(8, 9, True), (9, 8, False)])
def test_the_tolerance_counts_keys_not_queries(queries, keys, passes):
    """bfloat16 over 9 keys allows 5 units of roundoff (0.0195), over 8 keys 4 (0.0156):
    rows off by 0.0176 pass over 9 keys whatever the query count, and fail over 8."""
    from attnaudit.testing import assert_attention_healthy

    assert row_sum_tolerance(torch.bfloat16, 9) > ERROR > row_sum_tolerance(torch.bfloat16, 8)
    model = TappedRows(queries, keys)
    if passes:
        [found] = [f for f in assert_attention_healthy(model, model) if f.check == "row_sum"]
        assert found.detail == "|row sum - 1| at most 0.0176 (tolerance 0.0195312)"
    else:
        with pytest.raises(AssertionError, match=f"row_sum: {queries} of {queries} rows have "
                                                 r"\|sum - 1\| above 0.015625 "):
            assert_attention_healthy(model, model)
