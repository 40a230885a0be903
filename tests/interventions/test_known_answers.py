"""Interventions on hand-built models whose answers are known in advance."""

import numpy as np
import pandas as pd
import pytest
import torch

from attnaudit.errors import InterventionError
from attnaudit.interventions.ablation import (
    cumulative_test,
    remove_keys,
    uniform_test,
    zeroing_test,
)
from attnaudit.interventions.adversarial import adversarial_search
from attnaudit.interventions.permutation import (
    eligible_permutation,
    permutation_summary,
    permutation_test,
)
from attnaudit.interventions.reference_run import reference
from attnaudit.interventions.values import value_replacement
from tests.helpers.fingerprints import assert_unchanged, model_fingerprint
from tests.helpers.toys.pointer import DOMINATED_SCORES, SOURCES, dominated_target


def _toy_weights(src: list[int]) -> torch.Tensor:
    return torch.softmax(torch.tensor([DOMINATED_SCORES[i] for i in src]), 0)


def _ref(target):
    return reference(target, next(iter(target.batches())))


def test_site_that_ignores_its_weights_gives_tvd_zero_everywhere():
    target = dominated_target(ignore=True)
    ref = _ref(target)
    frames = [permutation_test(target, ref, n_permutations=10), uniform_test(target, ref),
              zeroing_test(target, ref), value_replacement(target, ref)[0]]
    for frame in frames:
        for column in [c for c in frame.columns if c.endswith(("_tvd", "_jsd"))
                       and not c.startswith("value_other_example")]:  # softmax path: no values
            assert frame[column].abs().max() < 1e-6, column
        for column in [c for c in frame.columns if c.endswith(("_flip", "_flip_rate"))
                       and not c.startswith("value_other_example")]:
            assert not frame[column].astype(bool).any(), column
    cumulative = cumulative_test(target, ref, random_draws=1)
    assert not cumulative["flipped"].any()
    per_row, per_candidate = adversarial_search(target, ref, steps=5)
    assert per_candidate["output_tvd"].max() < 1e-6
    assert (per_row["n_within_eps"] == 5).all()


def test_dominant_key_flips_when_zeroed_and_not_when_another_key_is():
    target = dominated_target()
    ref = _ref(target)
    frame = zeroing_test(target, ref)
    assert frame["zero_top_flip"].all()
    assert not frame["zero_random_flip"].any()
    # independent: the top key is source token 1 in every example
    for _, row in frame.iterrows():
        weights = _toy_weights(SOURCES[int(row["example"])])
        assert row["max_attention"] == pytest.approx(float(weights.max()), abs=1e-6)
        # the random key's weight is one of the non-top weights
        gaps = [float(weights.max() - w) for w in sorted(weights.tolist())[:-1]]
        assert min(abs(row["zero_weight_difference"] - g) for g in gaps) < 1e-6


def test_eligible_permutation_moves_only_eligible_keys():
    eligible = torch.tensor([True, False, True, True, False, True])
    noise = torch.rand(200, 6, generator=torch.Generator().manual_seed(0))
    perms = eligible_permutation(eligible, noise)
    assert torch.equal(perms[:, ~eligible], torch.arange(6)[~eligible].expand(200, -1))
    assert all(sorted(p.tolist()) == list(range(6)) for p in perms)
    assert len({tuple(p.tolist()) for p in perms}) == 24  # all 4! orders of eligible keys


def test_permutation_summary_bins_match_pandas_reference():
    gen = np.random.default_rng(0)
    rows = pd.DataFrame({"max_attention": gen.uniform(0, 1, 50),
                         "perm_median_tvd": gen.uniform(0, 0.2, 50)})
    summary = permutation_summary(rows)
    for b in range(4):
        lo, hi = b / 4, (b + 1) / 4
        part = rows[(rows.max_attention > lo) & (rows.max_attention <= hi)]
        got = summary.iloc[b]
        assert got["n"] == len(part)
        assert got["median_perm_median_tvd"] == pytest.approx(part.perm_median_tvd.median())
        assert got["share_small_tvd"] == pytest.approx((part.perm_median_tvd < 0.05).mean())


def test_cumulative_fractions_match_reference():
    target = dominated_target()
    ref = _ref(target)
    frame = cumulative_test(target, ref, random_draws=2)
    attention = frame[frame["order"] == "attention"]
    assert attention["flipped"].all()
    for _, row in attention.iterrows():
        src = SOURCES[int(row["example"])]
        weights = _toy_weights(src)
        assert row["keys_removed"] == 1
        assert row["frac_keys"] == pytest.approx(1 / len(src))
        assert row["frac_mass"] == pytest.approx(float(weights.max()), abs=1e-6)


def test_remove_keys_renormalises_and_falls_back_to_uniform():
    old = torch.tensor([[[0.5, 0.5, 0.0, 0.0]]])
    eligible = torch.tensor([[True, True, True, False]])
    out = remove_keys(old, torch.tensor([[True, False, False, False]]), eligible)
    assert torch.allclose(out, torch.tensor([[[0.0, 1.0, 0.0, 0.0]]]))
    out = remove_keys(old, torch.tensor([[True, True, False, False]]), eligible)
    assert torch.allclose(out, torch.tensor([[[0.0, 0.0, 1.0, 0.0]]]))


def test_adversarial_never_reports_a_candidate_above_eps():
    target = dominated_target()
    ref = _ref(target)
    per_row, per_candidate = adversarial_search(target, ref, steps=40, eps=0.05)
    for (example, step), group in per_candidate.groupby(["example", "step"]):
        ok = group[group["output_tvd"] <= 0.05]
        expected = ok["jsd_to_original"].max() if len(ok) else 0.0
        got = per_row[(per_row.example == example) & (per_row.step == step)].iloc[0]
        assert got["eps_max_jsd"] == pytest.approx(expected)
        assert got["n_within_eps"] == len(ok)
    assert (per_row["eps_max_jsd"] <= np.log(2) + 1e-6).all()


def test_same_seed_same_bits_and_model_unchanged():
    target = dominated_target()
    before = model_fingerprint(target.model)
    ref = _ref(target)
    runs = [(permutation_test(target, ref, n_permutations=15), cumulative_test(target, ref),
             adversarial_search(target, ref, steps=5)[1]) for _ in range(2)]
    for a, b in zip(*runs, strict=True):
        pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert_unchanged(target.model, before)
    assert all(p.grad is None for p in target.model.parameters())


def test_unknown_site_is_a_clear_error():
    target = dominated_target()
    with pytest.raises(InterventionError, match="not seen"):
        reference(target, next(iter(target.batches())), sites=["nowhere"])
