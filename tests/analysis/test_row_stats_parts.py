"""Several parts of one site's rows folded together (RowStats.add_parts,
Analyser.update_parts) give what folding them one by one gives, and the hand-computed
summaries."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from attnaudit.analysis import MaskingAnalyser, NumericsAnalyser, RowStats
from attnaudit.analysis.base import AttentionRows
from attnaudit.analysis.stats import MetricSpec

SPECS = (MetricSpec("a", 0.0, 1.0), MetricSpec("b", 0.0, 4.0))


def _parts() -> list[tuple[dict, int]]:
    gen = torch.Generator().manual_seed(0)
    first = torch.rand(3, 2, 4, generator=gen, dtype=torch.float64)  # steps 0..3
    second = torch.rand(2, 2, 2, generator=gen, dtype=torch.float64) * 4  # steps 5..6
    second[0, 1, 0] = float("nan")  # never counted
    defined = torch.tensor([[True, False]]).reshape(1, 1, 2).expand(2, 2, 2)
    return [({"a": (first, None), "b": (first * 4, first > 0.5)}, 0),
            ({"a": (second / 4, defined), "b": (second, None)}, 5)]


def test_parts_fold_as_one_by_one_and_by_hand() -> None:
    together, apart = RowStats(SPECS), RowStats(SPECS)
    together.add_parts("s", "self", _parts())
    for metrics, offset in _parts():
        for name, (values, defined) in metrics.items():
            apart.add("s", "self", name, values, defined, offset)
    frame = together.frame()
    pd.testing.assert_frame_equal(frame, apart.frame(), check_exact=True)
    first, second = _parts()[0][0]["a"][0].numpy(), _parts()[1][0]["b"][0].numpy()
    b = frame[frame.metric == "b"].set_index(["head", "step"])
    for head in range(2):
        for step in range(4):  # the first part: b = 4 * first, defined where first > 0.5
            counted = 4 * first[:, head, step][first[:, head, step] > 0.5]
            if len(counted):
                assert b.loc[(head, step), "n"] == len(counted)
                np.testing.assert_allclose(b.loc[(head, step), "sum"], counted.sum(),
                                           rtol=1e-12)
                assert b.loc[(head, step), "max"] == counted.max()
            else:
                assert (head, step) not in b.index
    column = second[:, 1, 0]
    finite = column[np.isfinite(column)]
    assert b.loc[(1, 5), "n"] == 1  # the NaN is not counted
    assert (b.loc[(1, 5), "min"], b.loc[(1, 5), "max"]) == (finite.min(), finite.max())
    a = frame[frame.metric == "a"].set_index(["head", "step"])
    assert (0, 6) not in a.index  # step 6 of the second part is never defined for "a"
    assert sorted(set(a.index.get_level_values("step"))) == [0, 1, 2, 3, 5]


def test_analysers_update_parts_as_update_in_turn() -> None:
    gen = torch.Generator().manual_seed(1)
    weights = torch.softmax(torch.randn(5, 2, 6, 7, generator=gen), -1).double()
    weights[1, 0, 2] = 0.0  # a row that does not sum to one
    eligible = torch.ones_like(weights, dtype=torch.bool)
    eligible[3, :, :, 5:] = False
    parts = [AttentionRows("s", "cross", weights[idx][:, :, a:b], eligible[idx][:, :, a:b],
                           step_offset=a, dtype=torch.float32)
             for idx, a, b in ((torch.tensor([0, 2]), 0, 6), (torch.tensor([1, 3, 4]), 0, 3),
                               (torch.tensor([4]), 4, 6))]
    for make in (MaskingAnalyser, lambda: NumericsAnalyser(None)):
        together, apart = make(), make()
        together.update_parts(parts)
        for part in parts:
            apart.update(part)
        pd.testing.assert_frame_equal(together.compute(), apart.compute(), check_exact=True)


def _hand_quantile(values: list[float], q: float, lo: float, hi: float) -> float:
    """The histogram quantile by hand: counts per bin, the first bin whose running count
    reaches q of the total, linear within it, clipped to the values' own range."""
    bins = [0] * 256
    for v in values:
        bins[min(max(int((v - lo) / (hi - lo) * 256), 0), 255)] += 1
    target, running = q * len(values), 0
    for b, count in enumerate(bins):
        if running + count >= target and count:
            frac = (target - running) / count
            return min(max(lo + (b + frac) * (hi - lo) / 256, min(values)), max(values))
        running += count
    raise AssertionError("no bin reached")


def test_quantiles_of_one_bin_and_spread_cells_by_hand() -> None:
    """Cells whose values all fall in one bin (read without a cumulative sum) and cells
    spread over bins, side by side in one summary."""
    stats = RowStats(SPECS)
    values = torch.tensor([[[0.0, 0.3, 0.31], [0.7, 0.7001, 0.9]]], dtype=torch.float64)
    spread = values.expand(4, 2, 3).clone()
    spread[:, 0, 0] = torch.tensor([0.0, 0.0, 0.0, 0.0])  # one bin: a constant
    spread[:, 1, 2] = torch.tensor([0.1, 0.5, 0.52, 0.99])  # spread over bins
    stats.add("s", "self", "a", spread)
    frame = stats.frame().set_index(["head", "step"])
    for head in range(2):
        for step in range(3):
            column = spread[:, head, step].tolist()
            for q in (0.1, 0.5, 0.9):
                expected = _hand_quantile(column, q, 0.0, 1.0)
                assert abs(frame.loc[(head, step), f"q{round(q * 100)}"] - expected) < 1e-12


def test_a_merged_cell_is_shared_until_either_state_writes_to_it() -> None:
    """merge hands a new cell over without copying it; adding to either state afterwards
    leaves the other as it was (each equals a state fed the same parts by itself)."""
    parts = _parts()

    def fed(*chunks: list[tuple[dict, int]]) -> RowStats:
        stats = RowStats(SPECS)
        for chunk in chunks:
            stats.add_parts("s", "self", chunk)
        return stats

    source, into = fed(parts[:1]), RowStats(SPECS)
    into.merge(source)
    into.add_parts("s", "self", parts[:1])  # steps 0..3 again: written in place, no growth
    pd.testing.assert_frame_equal(source.frame(), fed(parts[:1]).frame(), check_exact=True)
    source.add_parts("s", "self", parts[:1])
    pd.testing.assert_frame_equal(into.frame(), fed(parts[:1], parts[:1]).frame(),
                                  check_exact=True)
    pd.testing.assert_frame_equal(source.frame(), into.frame(), check_exact=True)
    again = RowStats(SPECS)
    again.merge(source)
    source.merge(fed(parts[:1]))  # merging into a shared cell leaves the other state too
    pd.testing.assert_frame_equal(again.frame(), fed(parts[:1], parts[:1]).frame(),
                                  check_exact=True)


def test_histograms_by_hand_across_growth_merges_and_counting_in() -> None:
    """Values folded step by step (the step axis grows), in batch states merged into one
    (as the validity audit merges each batch's), often enough that the codes waiting for
    a histogram are counted in midway, and read twice: every cell's quantiles are those
    of its values by hand, and reading does not count a value again."""
    gen = torch.Generator().manual_seed(3)
    audit, seen = RowStats(SPECS), {}
    for _ in range(150):
        batch = RowStats(SPECS)
        steps = int(torch.randint(1, 6, (), generator=gen))
        for step in range(steps):  # one call per step, as cached decoding hands them over
            values = torch.rand(3, 2, 1, generator=gen, dtype=torch.float64) ** 3
            batch.add("s", "self", "a", values, step_offset=step)
            for head in range(2):
                seen.setdefault((head, step), []).extend(values[:, head, 0].tolist())
        audit.merge(batch)
    assert any(cells.counted is not None for cells in audit.cells.values())
    for _ in range(2):
        frame = audit.frame().set_index(["head", "step"])
        for (head, step), column in seen.items():
            assert frame.loc[(head, step), "n"] == len(column)
            for q in (0.1, 0.5, 0.9):
                expected = _hand_quantile(column, q, 0.0, 1.0)
                assert abs(frame.loc[(head, step), f"q{round(q * 100)}"] - expected) < 1e-12
