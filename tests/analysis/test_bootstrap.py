"""Bootstrap intervals over examples: reproducible with the seed, covering a known mean at
about their level in simulation, resampling examples (not rows), and equal to a hand-written
percentile bootstrap."""

from __future__ import annotations

import numpy as np
import pytest

from attnaudit.analysis.bootstrap import bootstrap_interval
from attnaudit.errors import AttnauditError


def test_the_same_seed_gives_the_same_interval_and_another_seed_another():
    values = np.random.default_rng(3).normal(size=40)
    a, b = bootstrap_interval(values, seed=7), bootstrap_interval(values, seed=7)
    assert (a.low, a.high) == (b.low, b.high)
    c = bootstrap_interval(values, seed=8)
    assert (a.low, a.high) != (c.low, c.high)
    assert a.estimate == pytest.approx(values.mean())


def test_ninety_five_percent_intervals_cover_a_known_mean_about_that_often():
    rng = np.random.default_rng(0)
    mean, trials, covered = 0.3, 300, 0
    for trial in range(trials):
        sample = rng.normal(mean, 1.0, size=60)
        found = bootstrap_interval(sample, resamples=400, seed=trial)
        covered += found.low <= mean <= found.high
    # binomial(300, 0.95) lies in [0.91, 0.98] with probability > 0.99; the percentile
    # interval under-covers slightly at n = 60
    assert 0.89 <= covered / trials <= 0.99


def test_rows_are_resampled_by_example():
    # two examples of 50 identical rows each: resampling rows would give a narrow interval
    # around 0.5; resampling the two examples gives replicates 0, 0.5 and 1
    values = np.r_[np.zeros(50), np.ones(50)]
    examples = np.r_[np.zeros(50, int), np.ones(50, int)]
    found = bootstrap_interval(values, examples, resamples=2000, seed=1)
    assert found.examples == 2 and found.rows == 100
    assert found.low == 0.0 and found.high == 1.0


def test_equals_a_hand_written_percentile_bootstrap_of_example_means():
    rng = np.random.default_rng(5)
    examples = rng.integers(0, 12, size=90)
    values = rng.random(90)
    found = bootstrap_interval(values, examples, resamples=500, seed=11)
    ids = np.unique(examples)
    draws = np.random.default_rng(11).integers(0, len(ids), (500, len(ids)))
    replicates = []
    for draw in draws:
        rows = np.concatenate([values[examples == ids[d]] for d in draw])
        replicates.append(rows.mean())
    assert found.low == pytest.approx(np.quantile(replicates, 0.025))
    assert found.high == pytest.approx(np.quantile(replicates, 0.975))
    median = bootstrap_interval(values, examples, statistic=np.median, resamples=500, seed=11)
    hand = [np.median(np.concatenate([values[examples == ids[d]] for d in draw]))
            for draw in draws]
    assert median.low == pytest.approx(np.quantile(hand, 0.025))
    assert median.estimate == pytest.approx(np.median(values))


def test_non_finite_rows_are_left_out_and_one_example_has_no_interval():
    found = bootstrap_interval(np.array([1.0, np.nan, 3.0]), np.array([0, 1, 0]))
    assert found.rows == 2 and found.examples == 1 and not found.defined
    assert found.estimate == 2.0
    assert "no interval" in str(found)
    assert "not computed" in str(bootstrap_interval(np.array([np.nan])))
    with pytest.raises(AttnauditError, match="level"):
        bootstrap_interval(np.ones(3), level=1.5)
    with pytest.raises(AttnauditError, match="example ids"):
        bootstrap_interval(np.ones(3), np.zeros(2))
