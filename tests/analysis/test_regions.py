"""RegionAnalyser (region_mass, top_weight_hit) against plain-loop references."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnaudit
from attnaudit.analysis.base import AttentionRows
from attnaudit.analysis.expectations import char_offsets, expected_from_spans
from attnaudit.analysis.regions import RegionAnalyser, mean_over_heads
from attnaudit.record import AttentionCall, AttentionRecord, Site
from attnaudit_examples.date.data import encode_sources, year_span
from attnaudit_examples.date.model import load_model

SITE = "model.decoder.layers.2.encoder_attn:cross"


def make_record(weights: torch.Tensor, mask: torch.Tensor | None = None,
                name: str = SITE) -> AttentionRecord:
    record = AttentionRecord(Site(name, "cross", "tap", "model"))
    record.append(AttentionCall(weights=weights, mask_source=(lambda: mask)))
    return record


def reference(weights, expected, eligible, selected):
    """Plain loops: {(metric, head, step): list of per-row values} over selected, defined rows.

    weights (B, H, Q, K) float; expected, eligible (B, H, Q, K) bool; selected (B, Q) bool.
    """
    out: dict[tuple[str, int, int], list[float]] = {}
    b_n, h_n, q_n, k_n = weights.shape
    for b in range(b_n):
        for h in range(h_n):
            for q in range(q_n):
                if not selected[b][q]:
                    continue
                row = [float(x) for x in weights[b, h, q]]
                keys = [k for k in range(k_n) if eligible[b, h, q, k]]
                if not keys or any(x != x or x in (float("inf"), float("-inf")) for x in row):
                    continue
                mass = 0.0
                for k in keys:
                    if expected[b, h, q, k]:
                        mass += row[k]
                top = keys[0]
                for k in keys:
                    if row[k] > row[top]:
                        top = k
                out.setdefault(("region_mass", h, q), []).append(mass)
                out.setdefault(("top_weight_hit", h, q), []).append(
                    1.0 if expected[b, h, q, top] else 0.0)
    return out


def check_frame(frame, ref, site=SITE):
    got = {(r.metric, r.head, r.step): r for r in frame.itertuples() if r.site == site}
    assert set(got) == set(ref)
    for key, values in ref.items():
        assert got[key].n == len(values), key
        assert got[key].mean == pytest.approx(sum(values) / len(values), abs=1e-12), key
        assert got[key].min == pytest.approx(min(values), abs=1e-12)
        assert got[key].max == pytest.approx(max(values), abs=1e-12)


def random_batch(seed, b=3, h=2, q=5, k=6):
    rng = np.random.default_rng(seed)
    w = rng.dirichlet(np.ones(k), size=(b, h, q))
    mask = rng.random((b, 1, 1, k)) < 0.8
    mask[..., 0] = True
    expected = rng.random((b, k)) < 0.4
    return w, mask, expected


def test_hand_computed_rows():
    # row 0: expected keys {1, 2} hold 0.6 + 0.3 = 0.9; top key 1 is expected -> hit 1
    # row 1: expected mass 0.2 + 0.3 = 0.5; top key 0 is not expected -> hit 0
    w = torch.tensor([[[[0.1, 0.6, 0.3], [0.5, 0.2, 0.3]]]])
    analyser = RegionAnalyser()
    analyser.update(make_record(w), expected=torch.tensor([[False, True, True]]))
    frame = analyser.compute().set_index(["metric", "step"])
    assert frame.loc[("region_mass", 0), "mean"] == pytest.approx(0.9)
    assert frame.loc[("region_mass", 1), "mean"] == pytest.approx(0.5)
    assert frame.loc[("top_weight_hit", 0), "mean"] == 1.0
    assert frame.loc[("top_weight_hit", 1), "mean"] == 0.0
    assert frame["layer"].unique().tolist() == [2]


@pytest.mark.parametrize("rows", [None, 2, 0, 99, [0, 3], torch.tensor([4, 1]),
                                  np.array([2, 2]), "mask"])
def test_random_batches_match_reference(rows):
    w, mask, expected = random_batch(0)
    b, _, q, _ = w.shape
    if isinstance(rows, str):
        rows = torch.from_numpy(np.random.default_rng(1).random((b, q)) < 0.5)
    selected = np.zeros((b, q), dtype=bool)
    if rows is None:
        selected[:] = True
    elif isinstance(rows, int):
        selected[:, :rows] = True
    elif isinstance(rows, torch.Tensor) and rows.dtype == torch.bool:
        selected = rows.numpy()
    else:
        for i in list(rows):
            selected[:, int(i)] = True
    analyser = RegionAnalyser()
    analyser.update(make_record(torch.from_numpy(w), torch.from_numpy(mask)),
                    expected=torch.from_numpy(expected), rows=rows)
    exp4 = np.broadcast_to(expected[:, None, None, :], w.shape)
    elig4 = np.broadcast_to(mask, w.shape)
    check_frame(analyser.compute(), reference(w, exp4, elig4, selected))


@pytest.mark.parametrize("rank", [1, 3, 4])
def test_expected_ranks(rank):
    w, _, _ = random_batch(2)
    b, h, q, k = w.shape
    rng = np.random.default_rng(3)
    shape = {1: (k,), 3: (b, q, k), 4: (b, h, q, k)}[rank]
    expected = rng.random(shape) < 0.5
    exp4 = {1: lambda e: e[None, None, None], 3: lambda e: e[:, None], 4: lambda e: e}[rank]
    analyser = RegionAnalyser()
    analyser.update(make_record(torch.from_numpy(w)), expected=torch.from_numpy(expected))
    ref = reference(w, np.broadcast_to(exp4(expected), w.shape), np.ones(w.shape, bool),
                    np.ones((b, q), bool))
    check_frame(analyser.compute(), ref)


def test_declared_eligibility_excludes_keys_from_mass_and_argmax():
    # key 0 is the top weight but declared ineligible: argmax falls to key 2 (expected)
    w = torch.tensor([[[[0.5, 0.1, 0.4]]]])
    eligible = torch.tensor([False, True, True])
    analyser = RegionAnalyser()
    analyser.update(make_record(w), expected=torch.tensor([[True, False, True]]),
                    eligible=eligible)
    frame = analyser.compute().set_index("metric")
    assert frame.loc["region_mass", "mean"] == pytest.approx(0.4)
    assert frame.loc["top_weight_hit", "mean"] == 1.0


def test_nan_rows_and_rows_without_eligible_keys_are_excluded():
    w, mask, expected = random_batch(4)
    w[0, 1, 2, 3] = np.nan
    w[2, 0, 4, 0] = np.inf
    mask = np.broadcast_to(mask, w.shape).copy()
    mask[1, 0, 1, :] = False  # a row with no eligible key
    analyser = RegionAnalyser()
    analyser.update(make_record(torch.from_numpy(w), torch.from_numpy(mask)),
                    expected=torch.from_numpy(expected))
    frame = analyser.compute()
    assert frame["mean"].notna().all()
    ref = reference(w, np.broadcast_to(expected[:, None, None, :], w.shape), mask,
                    np.ones(w.shape[::2], bool))
    assert len(ref[("region_mass", 1, 2)]) == 2 and len(ref[("region_mass", 0, 1)]) == 2
    check_frame(frame, ref)


def test_merge_of_shards_equals_one_shot():
    w, mask, expected = random_batch(5, b=6)
    whole, first, second = RegionAnalyser(), RegionAnalyser(), RegionAnalyser()
    tw, tm, te = torch.from_numpy(w), torch.from_numpy(mask), torch.from_numpy(expected)
    whole.update(make_record(tw, tm), expected=te, rows=3)
    first.update(make_record(tw[:2], tm[:2]), expected=te[:2], rows=3)
    second.update(make_record(tw[2:], tm[2:]), expected=te[2:], rows=3)
    merged = first.merge(second).compute()
    one = whole.compute()
    assert merged[["site", "head", "step", "metric", "n"]].equals(
        one[["site", "head", "step", "metric", "n"]])
    np.testing.assert_allclose(merged[["mean", "sum", "min", "max", "q50"]].to_numpy(),
                               one[["mean", "sum", "min", "max", "q50"]].to_numpy(), atol=1e-12)


def test_empty_batch_gives_no_rows():
    analyser = RegionAnalyser()
    analyser.update(make_record(torch.zeros(0, 2, 3, 4)),
                    expected=torch.zeros(0, 4, dtype=torch.bool), rows=2)
    assert analyser.compute().empty


def test_shape_mismatch_names_site_and_shapes():
    analyser = RegionAnalyser()
    w = torch.full((2, 1, 3, 4), 0.25)
    with pytest.raises(ValueError, match=r"encoder_attn.*\(2, 5\).*\(2, 1, 3, 4\)"):
        analyser.update(make_record(w), expected=torch.zeros(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\(3, 3, 4\).*\(2, 1, 3, 4\)"):
        analyser.update(make_record(w), expected=torch.zeros(3, 3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool"):
        analyser.update(make_record(w), expected=torch.zeros(2, 4))
    with pytest.raises(ValueError, match="dims"):
        analyser.update(make_record(w), expected=torch.zeros(1, 2, 1, 3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"outside \[0, 3\)"):
        analyser.update(make_record(w), expected=torch.ones(4, dtype=torch.bool), rows=[3])
    with pytest.raises(ValueError, match="broadcast"):
        analyser.update(make_record(w), expected=torch.ones(4, dtype=torch.bool),
                        rows=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=">= 0"):
        analyser.update(make_record(w), expected=torch.ones(4, dtype=torch.bool), rows=-1)
    assert analyser.compute().empty


def test_mean_over_heads_reports_the_head_average_beside_heads():
    w, mask, expected = random_batch(6, h=3)
    record = make_record(torch.from_numpy(w), torch.from_numpy(mask))
    averaged = mean_over_heads(record)
    assert averaged.weights.shape == (3, 1, 5, 6) and averaged.site == SITE + ":head_mean"
    manual = np.zeros((3, 1, 5, 6))
    for h in range(3):
        manual[:, 0] += w[:, h] / 3
    np.testing.assert_allclose(averaged.weights.numpy(), manual, atol=1e-12)
    analyser = RegionAnalyser()
    analyser.update(record, expected=torch.from_numpy(expected))
    analyser.update(averaged, expected=torch.from_numpy(expected))
    frame = analyser.compute()
    assert set(frame["site"]) == {SITE, SITE + ":head_mean"}
    assert set(frame[frame["site"] == SITE + ":head_mean"]["layer"]) == {2}
    ref = reference(manual, np.broadcast_to(expected[:, None, None, :], manual.shape),
                    np.broadcast_to(mask, manual.shape), np.ones((3, 5), bool))
    check_frame(frame, ref, site=SITE + ":head_mean")


def test_mean_over_heads_refuses_head_specific_eligibility():
    w = torch.full((1, 2, 1, 2), 0.5)
    eligible = torch.tensor([[[[True, True]], [[True, False]]]])
    with pytest.raises(ValueError, match="differs between heads"):
        mean_over_heads(AttentionRows.of(make_record(w), eligible))


def test_date_model_reads_the_year_first(date_splits, date_vocabs):
    model = load_model()
    sources = [s for s, _ in date_splits.unambiguous("valid", 400)]
    src, lengths = encode_sources(date_vocabs[0], sources)
    with attnaudit.capture(model) as cap:
        model.greedy(src, lengths)
    record = cap.records["attend"]
    n_keys = record.weights.shape[-1]
    expected = expected_from_spans([char_offsets(s) for s in sources],
                                   [[year_span(s)] for s in sources], n_keys)
    direct = torch.zeros(len(sources), n_keys, dtype=torch.bool)
    for row, s in enumerate(sources):
        for i in year_span(s):
            direct[row, i] = True
    assert torch.equal(expected, direct)
    analyser = RegionAnalyser()
    analyser.update(record, expected=expected, rows=4)
    analyser.update(mean_over_heads(record), expected=expected, rows=4)
    frame = analyser.compute()
    per_head = frame[frame["site"] == "attend"]
    assert sorted(set(per_head["step"])) == [0, 1, 2, 3]
    totals = per_head.groupby("metric")[["sum", "n"]].sum()
    assert (totals["n"] == 1600).all()
    mass = totals.loc["region_mass", "sum"] / 1600
    hit = totals.loc["top_weight_hit", "sum"] / 1600
    assert mass >= 0.95, mass  # published: 97.5 %
    assert hit >= 0.99, hit  # published: 99.7 %
    averaged = frame[frame["site"] == "attend:head_mean"]  # one head: identical
    np.testing.assert_allclose(averaged["mean"].to_numpy(), per_head["mean"].to_numpy())


def test_per_example_rows_follow_the_reference_over_two_batches():
    """Opt-in per-example rows: only the selected rows, examples numbered across updates."""
    batches = [random_batch(seed, b=b) for seed, b in ((11, 3), (12, 2))]
    analyser = RegionAnalyser(per_example=True)
    for w, mask, expected in batches:
        analyser.update(make_record(torch.from_numpy(w), torch.from_numpy(mask)),
                        expected=torch.from_numpy(expected), rows=[1, 3])
    rows = analyser.examples()
    assert set(rows["step"]) == {1, 3}
    first = 0
    for w, mask, expected in batches:
        b = w.shape[0]
        selected = np.zeros((b, w.shape[2]), bool)
        selected[:, [1, 3]] = True
        ref = reference(w, np.broadcast_to(expected[:, None, None, :], w.shape),
                        np.broadcast_to(mask, w.shape), selected)
        part = rows[rows["example"].between(first, first + b - 1)]
        for (metric, head, step), values in ref.items():
            got = part[(part["metric"] == metric) & (part["head"] == head)
                       & (part["step"] == step)].sort_values("example")
            assert got["example"].tolist() == list(range(first, first + b))
            np.testing.assert_allclose(got["value"], values, atol=1e-12)
        first += b
    assert len(rows) == 2 * 2 * 2 * (3 + 2)  # metrics x heads x selected steps x examples
