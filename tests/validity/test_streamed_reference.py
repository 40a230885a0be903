"""The streamed validity audit's metrics table against a second computation that shares
none of its code: the per-row metrics of tests/helpers/metric_references.py (plain numpy, one
row at a time) applied to attention that never passed through capture — the date BART's
eager cross-attention (Hugging Face's own ``output_attentions``) and the date LSTM's
weights from its decoder written out by hand — summarised over the same examples in
several batches."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnaudit.analysis.entropy import EntropyAnalyser
from attnaudit.analysis.masking import MaskingAnalyser
from attnaudit.analysis.numerics import NumericsAnalyser
from attnaudit.analysis.stats import HIST_BINS
from attnaudit.validity.pipeline import run_validity_audit
from tests.helpers.distributed_targets import date_lstm, date_transformer
from tests.helpers.metric_references import (
    ENTROPY_METRICS,
    MASKING_METRICS,
    aggregate,
    per_row,
)

LIMIT = 10  # three batches of four: the last one short
COMPARED = (*ENTROPY_METRICS, *MASKING_METRICS, "non_finite_rows", "negative_rows",
            "all_masked")
EXACT = ("mean", "sum", "min", "max")
QUANTILES = ("q10", "q50", "q90")
# Streamed quantiles are read off a histogram of HIST_BINS bins over each metric's range
# (attnaudit/analysis/stats.py): within one bin width of the exact order statistic.
BIN_WIDTH = {spec.name: (spec.hi - spec.lo) / HIST_BINS
             for analyser in (EntropyAnalyser, MaskingAnalyser, NumericsAnalyser)
             for spec in analyser.metrics}


def eager_rows(target, batches) -> dict[str, list]:
    """Per site: the reference's per-row metrics of each batch, rows past a sequence's end
    left undefined (the audit counts only the steps that ran)."""
    import torch

    out: dict[str, list] = {}
    for batch in batches:
        emitted = target.greedy(batch)
        ran = target.step_mask(emitted).bool().numpy()  # (B, T)
        eligible = batch.source_mask.bool().numpy()[:, None, None, :]  # (B, 1, 1, S)
        if target.name == "date":
            from attnaudit_examples.date.model import load_model
            from attnaudit_examples.date.target import decoder_inputs
            from tests.helpers.date_reference import hand_written_decode

            weights, _, _ = hand_written_decode(load_model(), batch.source_ids,
                                                batch.inputs["lengths"],
                                                decoder_inputs(emitted))
            per_site = {"attend:cross": weights[:, None]}  # (B, 1, T, S)
        else:
            from tests.helpers.date_bart_eager import eager_cross_attentions

            per_site = {f"model.decoder.layers.{i}.encoder_attn:cross": w
                        for i, w in enumerate(eager_cross_attentions(batch, emitted))}
        for site, w in per_site.items():
            rows = per_row(w.to(torch.float64).numpy(), eligible)
            out.setdefault(site, []).append(
                {m: (v, d & ran[:, None, :]) for m, (v, d) in rows.items()})
    return out


@pytest.mark.parametrize("make", [date_transformer, date_lstm], ids=["date_bart", "date_lstm"])
def test_streamed_cross_attention_metrics_equal_numpy_on_uncaptured_weights(make):
    target = make()
    audit = run_validity_audit(target, limit=LIMIT, progress=False, timing=False,
                               keep_example=False)
    assert audit.examples == LIMIT
    batches = []
    for batch in target.iter_batches(LIMIT):
        batches.append(batch)
    assert len(batches) == 3
    for site, rows in eager_rows(target, batches).items():
        ours = audit.metrics[(audit.metrics.site == site)
                             & audit.metrics.metric.isin(COMPARED)]
        theirs = aggregate(site, rows, COMPARED)
        key = ["metric", "head", "step"]
        merged = pd.merge(ours, theirs, on=key, how="outer", suffixes=("", "_ref"),
                          indicator=True)
        assert (merged["_merge"] == "both").all(), merged.loc[merged["_merge"] != "both", key]
        assert len(merged) > 100 and set(merged.metric) == set(COMPARED)
        np.testing.assert_array_equal(merged["n"], merged["n_ref"], err_msg=site)
        for column in EXACT:
            # eager softmax and capture's explicit one differ by float32 rounding
            np.testing.assert_allclose(merged[column].to_numpy(float),
                                       merged[f"{column}_ref"].to_numpy(float),
                                       rtol=2e-4, atol=2e-5, err_msg=f"{site} {column}")
        width = merged.metric.map(BIN_WIDTH).to_numpy(float)
        for column in QUANTILES:
            gap = np.abs(merged[column].to_numpy(float) - merged[f"{column}_ref"].to_numpy(float))
            assert (gap <= width + 2e-5).all(), (site, column, merged.loc[gap > width + 2e-5])
