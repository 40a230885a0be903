"""ScoreAnalyser on captured models: score ranges, masking fills, output norms, and what it
says when a mechanism exposes no scores or values. Numbers are checked against what the
model itself computes (plain torch in the test), beside the numpy reference of the harness."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

import attnaudit
from attnaudit.analysis import AttentionRows, ScoreAnalyser
from tests.analysis.test_analyser_contract import assert_matches_reference
from tests.helpers.fingerprints import assert_unchanged, model_fingerprint
from tests.helpers.metric_references import OUTPUT_METRICS, SCORE_METRICS, aggregate, per_row_scores

SITE = "model.decoder.layers.1.attn:self"


class SdpaAttention(torch.nn.Module):
    """Multi-head attention through F.scaled_dot_product_attention with key padding."""

    def __init__(self, d: int = 8, heads: int = 2) -> None:
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(d, d) for _ in range(3))
        self.heads = heads

    def split(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        return x.reshape(b, n, self.heads, d // self.heads).transpose(1, 2)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split(self.q(x)), self.split(self.k(memory)), self.split(self.v(memory))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :])


class Wrap(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = SdpaAttention()

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.attn(*args)


@pytest.fixture
def sdpa_case():
    torch.manual_seed(0)
    model = Wrap().eval()
    x, memory = torch.randn(3, 4, 8), torch.randn(3, 5, 8)
    keep = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    return model, (x, memory, keep)


def _cell(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    return frame[frame["metric"] == metric]


def test_sdpa_scores_and_output_norms_match_the_model(sdpa_case):
    model, (x, memory, keep) = sdpa_case
    before = model_fingerprint(model)
    with torch.no_grad():
        output = model(x, memory, keep)  # (B, H, Q, d_head), fused kernel, no capture
        attn = model.attn
        q, k = attn.split(attn.q(x)), attn.split(attn.k(memory))
        logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, Q, K)
    with torch.no_grad(), attnaudit.capture(model, scores=True, values=True) as cap:
        model(x, memory, keep)
    assert_unchanged(model, before)
    (record,) = cap.records.values()
    analyser = ScoreAnalyser(per_example=True)
    analyser.update(record)
    assert analyser.unavailable().empty

    rows = analyser.examples()
    norms = rows[rows["metric"] == "output_norm"].sort_values(["example", "head", "step"])
    expected = torch.linalg.vector_norm(output, dim=-1)  # (B, H, Q)
    assert len(norms) == expected.numel()
    np.testing.assert_allclose(norms["value"], expected.flatten().numpy(), rtol=1e-5)

    eligible = keep[:, None, None, :].expand_as(logits)
    top = rows[rows["metric"] == "score_max"].sort_values(["example", "head", "step"])
    np.testing.assert_allclose(top["value"], logits.masked_fill(~eligible, -torch.inf)
                               .amax(-1).flatten().numpy(), rtol=1e-5)
    frame = analyser.compute()
    # a bool mask is an -inf fill: one per padded key per row, never a finite masked score
    padded = int((~keep).sum()) * 2 * 4  # keys x heads x query rows
    assert _cell(frame, "masked_score_non_finite")["sum"].sum() == padded
    assert _cell(frame, "masked_score_max").empty
    assert not frame[["mean", "min", "max"]].isna().any().any()


def test_softmax_path_has_no_values_and_says_so(date_model, date_batch):
    """The date LSTM's softmax is seen without its values: output_norm is absent (not NaN)
    and unavailable() names the site."""
    src, lengths, _ = date_batch
    src, lengths = src[:16], lengths[:16]
    before = model_fingerprint(date_model)
    with torch.no_grad(), attnaudit.capture(date_model, kinds={"attend": "cross"}, scores=True,
                                            values=True) as cap:
        date_model.greedy(src, lengths)
    assert_unchanged(date_model, before)
    record = cap.records["attend:cross"]
    analyser = ScoreAnalyser()
    analyser.update(record)
    frame = analyser.compute()
    assert set(frame["metric"]) == set(SCORE_METRICS) - {"masked_score_min", "masked_score_max"}
    assert not frame[["mean", "min", "max", "q50"]].isna().any().any()
    missing = analyser.unavailable()
    assert missing[["site", "kind", "input", "updates"]].values.tolist() == [
        ["attend:cross", "cross", "values", 1]]
    # -inf fill on each source's padding, at every decoder step
    pad_keys = int((src.shape[1] - lengths).sum())
    steps = record.weights.shape[2]
    assert _cell(frame, "masked_score_non_finite")["sum"].sum() == pad_keys * steps
    assert (_cell(frame, "score_non_finite")["sum"] == 0).all()
    assert (_cell(frame, "score_min")["min"] <= _cell(frame, "score_max")["max"].values).all()


@pytest.mark.parametrize(("fill", "leaks"), [(0.0, True), (-1e9, False), (-math.inf, False)])
def test_masking_fill_is_reported_apart_from_the_score_range(fill, leaks):
    """A 0 fill (which leaks mass) shows as masked_score_max = 0; -1e9 as itself; -inf as a
    count. The range of eligible scores is the same in all three."""
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 1, 3, 5, dtype=torch.float64, generator=gen)
    keep = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.bool)
    scores = logits.masked_fill(~keep[:, None, None, :], fill)
    rows = AttentionRows(SITE, "self", torch.softmax(scores, -1),
                         keep[:, None, None, :].expand(2, 1, 3, 5))
    analyser = ScoreAnalyser()
    analyser.update(rows, scores=scores)
    frame = analyser.compute()
    inside = logits.masked_fill(~keep[:, None, None, :], math.nan)
    assert _cell(frame, "score_max")["max"].max() == pytest.approx(
        float(np.nanmax(inside.numpy())))
    assert _cell(frame, "score_min")["min"].min() == pytest.approx(
        float(np.nanmin(inside.numpy())))
    fills = _cell(frame, "masked_score_max")
    if math.isfinite(fill):
        assert (fills["min"] == fill).all() and (fills["max"] == fill).all()
        assert _cell(frame, "masked_score_non_finite")["sum"].sum() == 0
    else:
        assert fills.empty
        assert _cell(frame, "masked_score_non_finite")["sum"].sum() == 3 * (2 + 1)
    assert leaks == bool(rows.weights.where(~rows.eligible, 0).sum() > 1e-3)
    assert analyser.unavailable()["input"].tolist() == ["values"]


def test_grouped_query_values_follow_the_reference():
    gen = torch.Generator().manual_seed(5)
    w = torch.softmax(torch.randn(2, 4, 3, 5, dtype=torch.float64, generator=gen), -1)
    values = torch.randn(2, 2, 5, 3, dtype=torch.float64, generator=gen)  # 2 value heads
    eligible = torch.ones(2, 4, 3, 5, dtype=torch.bool)
    analyser = ScoreAnalyser()
    analyser.update(AttentionRows(SITE, "self", w, eligible), values=values)
    ref = aggregate(SITE, [per_row_scores(w.numpy(), eligible.numpy(), None, values.numpy())],
                    OUTPUT_METRICS)
    assert_matches_reference(analyser.compute(), ref, analyser)


@pytest.mark.parametrize(("scores", "values", "message"), [
    (torch.zeros(2, 1, 3, 6), None, "does not broadcast"),
    (torch.zeros(2, 1, 3, 5, dtype=torch.int64), None, "floating-point"),
    (None, torch.zeros(2, 1, 6, 2), "do not fit"),
    (None, torch.zeros(2, 3, 5, 2), "do not fit"),
    (None, torch.zeros(2, 5, 2), r"\(batch, heads, keys, d_v\)"),
])
def test_bad_scores_or_values_are_value_errors(scores, values, message):
    w = torch.softmax(torch.randn(2, 2, 3, 5), -1)
    rows = AttentionRows(SITE, "self", w, torch.ones(5, dtype=torch.bool))
    with pytest.raises(ValueError, match=message):
        ScoreAnalyser().update(rows, scores=scores, values=values)


def test_unavailable_merges_and_resets():
    w = torch.softmax(torch.randn(1, 1, 2, 3), -1)
    rows = AttentionRows(SITE, "self", w, torch.ones(3, dtype=torch.bool))
    a, b = ScoreAnalyser(), ScoreAnalyser()
    a.update(rows, scores=torch.zeros(1, 1, 2, 3))
    b.update(rows, values=torch.ones(1, 1, 3, 2))
    b.update(rows)
    a.merge(b)
    got = a.unavailable().set_index("input")["updates"].to_dict()
    assert got == {"scores": 2, "values": 2}
    assert a.unavailable()["layer"].tolist() == [1, 1]
    a.reset()
    assert a.unavailable().empty and a.compute().empty
