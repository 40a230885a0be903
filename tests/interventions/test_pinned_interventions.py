"""Every intervention number against an independent computation on the hand-built pointers.

The toy's forward is re-implemented here (``toy_probs``, ``read``); edited weights are built
here from METRICS.md's definitions or, where a protocol draws at random, read at the model's
boundary (``ToyPointer.seen``: the weights the model actually multiplied with its values).
Nothing expected is taken from the code under test.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon

from attnaudit.interventions.ablation import (
    cumulative_test,
    uniform_test,
    weight_gradients,
    zeroing_test,
)
from attnaudit.interventions.adversarial import adversarial_search
from attnaudit.interventions.permutation import permutation_test
from attnaudit.interventions.reference_run import Reference, RowIndex, reference
from attnaudit.interventions.values import value_replacement
from tests.helpers.toys.pointer import (
    DOMINATED_SCORES,
    DOMINATED_VALUES,
    MIXED_SCORES,
    MIXED_SOURCES,
    MIXED_VALUES,
    SOURCES,
    dominated_target,
    mixed_target,
    toy_probs,
)

TOYS = {"dominated": (dominated_target, DOMINATED_SCORES, DOMINATED_VALUES, SOURCES),
        "mixed": (mixed_target, MIXED_SCORES, MIXED_VALUES, MIXED_SOURCES)}


class Toy:
    """A toy target, its reference run, and its attention recomputed by hand."""

    def __init__(self, name: str) -> None:
        make, scores, values, sources = TOYS[name]
        self.name = name
        self.target = make()
        self.ref: Reference = reference(self.target, next(iter(self.target.batches())))
        self.scores, self.sources = torch.tensor(scores), sources
        self.values = torch.tensor(values, dtype=torch.float32)

    def weights(self, example: int) -> torch.Tensor:
        """(n_valid,): softmax of the source tokens' scores (no padding, no special token)."""
        return torch.softmax(self.scores[self.sources[example]], 0)

    def value_rows(self, example: int) -> torch.Tensor:
        """(n_valid, 3): the value vector at each source position."""
        return self.values[self.sources[example]].clone()

    def probs(self, example: int, step: int, weights: torch.Tensor,
              values: torch.Tensor | None = None) -> torch.Tensor:
        """Output distribution for weights over the real source positions."""
        rows = self.value_rows(example) if values is None else values
        return read(rows, weights, step)

    def before(self, example: int, step: int) -> torch.Tensor:
        return self.probs(example, step, self.weights(example))

    def one_row(self, example: int, step: int) -> RowIndex:
        return RowIndex(torch.tensor([example]), torch.tensor([step]))


def read(values: torch.Tensor, weights: torch.Tensor, step: int) -> torch.Tensor:
    """ToyPointer's output for per-position value vectors (n, 3) and weights (..., n)."""
    return toy_probs(values, list(range(values.shape[0])), weights, step)


def np_tvd(p: torch.Tensor, q: torch.Tensor) -> np.ndarray:
    return 0.5 * np.abs(p.double().numpy() - q.double().numpy()).sum(-1)


def np_jsd(p: torch.Tensor, q: torch.Tensor) -> float:
    return float(jensenshannon(p.double().numpy(), q.double().numpy()) ** 2)


def flipped(p: torch.Tensor, q: torch.Tensor) -> bool:
    return bool(p.argmax(-1) != q.argmax(-1))


@pytest.fixture(scope="module", params=list(TOYS))
def toy(request) -> Toy:
    return Toy(request.param)


def test_value_replacement_reads_zero_and_the_mean_of_eligible_values(toy):
    """METRICS.md: replace the value vector at the top-weighted key (zero, mean of eligible
    values); recomputed here by editing values, not weights."""
    frame, status = value_replacement(toy.target, toy.ref)
    assert len(frame) == len(toy.ref.rows()) > 0
    padded = 0
    for row in frame.itertuples():
        ex, step = int(row.example), int(row.step)
        w = toy.weights(ex)
        padded += len(w) < toy.ref.batch.source_ids.shape[1]
        top = int(w.argmax())
        before = toy.before(ex, step)
        for control in ("zero", "mean"):
            values = toy.value_rows(ex)
            values[top] = 0.0 if control == "zero" else values.mean(0)
            after = toy.probs(ex, step, w, values)
            assert getattr(row, f"value_{control}_tvd") == pytest.approx(
                float(np_tvd(before, after)), abs=1e-6)
            assert getattr(row, f"value_{control}_jsd") == pytest.approx(
                np_jsd(before, after), abs=1e-6)
            assert getattr(row, f"value_{control}_flip") == flipped(before, after)
    assert padded > 0  # rows with padding keys, which must read nothing
    assert frame["value_mean_tvd"].max() > 1e-3
    assert list(status["control"]) == ["zero", "mean", "zero_random", "mean_random",
                                       "other_example", "other_example_random"]


def test_value_replacement_at_the_random_key_is_one_other_eligible_key(toy):
    """The random-key controls: recomputed here by editing values at every non-top eligible
    key; one key must explain both controls' numbers of a row (the seeded draw is not
    re-derived here), and a row with one eligible key has NaN."""
    frame, status = value_replacement(toy.target, toy.ref)
    checked = 0
    for row in frame.itertuples():
        ex, step = int(row.example), int(row.step)
        w = toy.weights(ex)
        if len(w) < 2:
            assert np.isnan(row.value_zero_random_tvd) and np.isnan(row.value_mean_random_tvd)
            continue
        before, top = toy.before(ex, step), int(w.argmax())
        fits = []
        for key in (k for k in range(len(w)) if k != top):
            ok = True
            for control in ("zero", "mean"):
                values = toy.value_rows(ex)
                values[key] = 0.0 if control == "zero" else values.mean(0)
                after = toy.probs(ex, step, w, values)
                ok &= abs(getattr(row, f"value_{control}_random_tvd")
                          - float(np_tvd(before, after))) <= 1e-6
                ok &= abs(getattr(row, f"value_{control}_random_jsd")
                          - np_jsd(before, after)) <= 1e-6
                ok &= bool(getattr(row, f"value_{control}_random_flip")) == flipped(before, after)
            if ok:
                fits.append(key)
        assert len(fits) >= 1, (ex, step)
        checked += 1
    assert checked > 0
    if toy.name == "mixed":  # a non-top key moves the output: the match can fail
        assert frame["value_zero_random_tvd"].max() > 1e-3
    ran = status.set_index("control")
    assert ran.loc["zero_random", "n"] == checked
    assert ran.loc["other_example", "status"] == "not reachable"


def test_uniform_and_single_zeroing_match_hand_edited_weights(toy):
    uniform, zeroing = uniform_test(toy.target, toy.ref), zeroing_test(toy.target, toy.ref)
    for row in uniform.itertuples():
        ex, step = int(row.example), int(row.step)
        w = toy.weights(ex)
        after = toy.probs(ex, step, torch.full_like(w, 1 / len(w)))
        assert row.uniform_tvd == pytest.approx(float(np_tvd(toy.before(ex, step), after)),
                                                abs=1e-6)
        assert row.max_attention == pytest.approx(float(w.max()), abs=1e-6)
    for row in zeroing.itertuples():
        ex, step = int(row.example), int(row.step)
        w, before = toy.weights(ex), toy.before(ex, step)

        def zeroed(key: int, w=w, ex=ex, step=step) -> torch.Tensor:
            kept = w.clone()
            kept[key] = 0.0
            return toy.probs(ex, step, kept / kept.sum())

        top = int(w.argmax())
        assert row.zero_top_tvd == pytest.approx(float(np_tvd(before, zeroed(top))), abs=1e-6)
        assert row.zero_top_flip == flipped(before, zeroed(top))
        # the random key is one of the others: its weight gap and TVD belong to the same key
        options = [(float(w[top] - w[j]), float(np_tvd(before, zeroed(j))))
                   for j in range(len(w)) if j != top]
        assert any(abs(row.zero_weight_difference - gap) < 1e-6
                   and abs(row.zero_random_tvd - change) < 1e-6 for gap, change in options)


def test_permutation_medians_from_the_weights_the_model_read(toy):
    """Each permutation is checked where it lands: the weights the model multiplied with its
    values must be the row's weights reordered among real tokens, padding left at zero; the
    TVD, JSD and flips are recomputed from them and the median taken by numpy."""
    n_perm = 10  # even: the median is the mean of the two middle values
    model = toy.target.model
    rows = toy.ref.rows()
    moved = 0
    for i in range(len(rows)):
        ex, step = int(rows.example[i]), int(rows.step[i])
        model.seen = []
        try:
            got = permutation_test(toy.target, toy.ref, toy.one_row(ex, step),
                                   n_permutations=n_perm).iloc[0]
            used = model.seen[step]  # (n_perm, n): the calls before are unedited steps
        finally:
            model.seen = None
        w, before = toy.weights(ex), toy.before(ex, step)
        real = len(w)
        assert used.shape == (n_perm, toy.ref.batch.source_ids.shape[1])
        assert torch.equal(used[:, real:], torch.zeros(n_perm, used.shape[1] - real))
        for perm in used[:, :real]:
            torch.testing.assert_close(perm.sort().values, w.sort().values)
        moved += int((used[:, :real] - w).abs().amax(-1).gt(1e-6).sum())
        after = toy.probs(ex, step, used[:, :real])
        tvds = np_tvd(before.expand_as(after), after)
        jsds = [np_jsd(before, a) for a in after]
        flips = (after.argmax(-1) != before.argmax()).double().numpy()
        assert got["perm_median_tvd"] == pytest.approx(float(np.median(tvds)), abs=1e-6)
        assert got["perm_median_jsd"] == pytest.approx(float(np.median(jsds)), abs=1e-6)
        assert got["perm_flip_rate"] == pytest.approx(flips.mean(), abs=1e-6)
    assert moved > len(rows) * n_perm // 2  # most draws really reorder the row


def test_weight_gradients_match_autograd_on_the_hand_written_forward():
    toy = Toy("mixed")
    rows = toy.ref.rows()
    got = weight_gradients(toy.target, toy.ref, rows)
    assert got.shape == (len(rows), 1, toy.ref.eligible.shape[-1])
    for i in range(len(rows)):
        ex, step = int(rows.example[i]), int(rows.step[i])
        w = toy.weights(ex).requires_grad_()
        p = toy.probs(ex, step, w)
        (grad,) = torch.autograd.grad(p[p.argmax()], w)
        torch.testing.assert_close(got[i, 0, : len(w)], grad, atol=1e-6, rtol=1e-5)
        assert float(got[i, 0, len(w):].abs().sum()) == 0.0  # padding keys


def _first_flip(toy: Toy, ex: int, step: int, order: list[int]) -> tuple[int, float]:
    """Remove keys in ``order`` until the argmax flips (at most n_valid - 1 keys): the
    number removed and the attention mass removed over the row's mass; (0, nan) if never."""
    w, before = toy.weights(ex), toy.before(ex, step)
    for k in range(1, len(w)):
        kept = w.clone()
        kept[order[:k]] = 0.0
        if flipped(before, toy.probs(ex, step, kept / kept.sum())):
            return k, float(w[order[:k]].sum() / w.sum())
    return 0, math.nan


def test_cumulative_removal_in_every_order():
    toy = Toy("mixed")
    frame = cumulative_test(toy.target, toy.ref, random_draws=3)
    assert set(frame["order"]) == {"attention", "random", "gradient", "attention_x_gradient"}
    outcomes = set()
    for row in frame.itertuples():
        ex, step = int(row.example), int(row.step)
        w = toy.weights(ex).requires_grad_()
        p = toy.probs(ex, step, w)
        (grad,) = torch.autograd.grad(p[p.argmax()], w)
        w = w.detach()
        key_scores = {"attention": w, "gradient": grad, "attention_x_gradient": w * grad}
        if row.order == "random":  # the draw is the code's: any order of the keys will do
            possible = {_first_flip(toy, ex, step, list(o))
                        for o in itertools.permutations(range(len(w)))}
            expected = next(o for o in possible if o[0] == row.keys_removed)
            assert any(o[0] == row.keys_removed and (
                math.isnan(o[1]) if math.isnan(row.frac_mass)
                else abs(o[1] - row.frac_mass) < 1e-6) for o in possible)
        else:
            order = sorted(range(len(w)), key=lambda j, s=key_scores[row.order]: -float(s[j]))
            expected = _first_flip(toy, ex, step, order)
            if not math.isnan(expected[1]):
                assert row.frac_mass == pytest.approx(expected[1], abs=1e-6)
        assert (row.keys_removed, row.flipped) == (expected[0], expected[0] > 0)
        assert row.n_valid == len(w)
        if row.flipped:
            assert row.frac_keys == pytest.approx(row.keys_removed / len(w))
        else:
            assert math.isnan(row.frac_keys) and math.isnan(row.frac_mass)
        outcomes.add((row.order, row.keys_removed))
    # the orders disagree on this toy, so an order computed the wrong way round shows
    by_order = {o: {k for order, k in outcomes if order == o} for o, _ in outcomes}
    assert by_order["attention"] != by_order["gradient"]


def test_adversarial_candidates_checked_where_the_model_reads_them():
    """The constraint and eps-max JSD recomputed from the final candidates' weights as the
    model used them: output TVD by the hand-written forward, JSD to the original by scipy."""
    toy = Toy("dominated")
    model = toy.target.model
    eps = 0.05
    rows = toy.ref.rows()
    for i in range(len(rows)):
        ex, step = int(rows.example[i]), int(rows.step[i])
        model.seen = []
        try:
            per_row, per_candidate = adversarial_search(
                toy.target, toy.ref, toy.one_row(ex, step), steps=60, eps=eps)
            used = model.seen[-1]  # (K, n): the last call is the final pass's edited step
        finally:
            model.seen = None
        w, before = toy.weights(ex), toy.before(ex, step)
        real = len(w)
        assert used.shape[0] == 5
        assert torch.equal(used[:, real:], torch.zeros(5, used.shape[1] - real))
        change = np_tvd(before.expand(5, -1), toy.probs(ex, step, used[:, :real]))
        away = np.array([np_jsd(c, w) for c in used[:, :real]])
        np.testing.assert_allclose(per_candidate["output_tvd"], change, atol=1e-6)
        np.testing.assert_allclose(per_candidate["jsd_to_original"], away, atol=1e-6)
        within = change <= eps
        got = per_row.iloc[0]
        assert got["n_within_eps"] == within.sum()
        assert got["eps_max_jsd"] == pytest.approx(away[within].max() if within.any() else 0.0,
                                                   abs=1e-6)
        assert got["min_tvd"] == pytest.approx(change.min(), abs=1e-6)


def test_adversarial_search_moves_away_within_the_constraint():
    """Where no weight can change the output, the search must end far from the original:
    at least 0.9 of the largest JSD any distribution over the real keys reaches (a one-hot
    on the original's lightest key); where one key decides the output, it keeps candidates
    within eps."""
    ignored = dominated_target(ignore=True)
    ref = reference(ignored, next(iter(ignored.batches())))
    per_row, _ = adversarial_search(ignored, ref, steps=300)
    for row in per_row.itertuples():
        w = torch.softmax(torch.tensor(DOMINATED_SCORES)[SOURCES[row.example]], 0)
        farthest = max(np_jsd(torch.eye(len(w))[j], w) for j in range(len(w)))
        assert row.eps_max_jsd >= 0.9 * farthest
    toy = Toy("dominated")
    per_row, _ = adversarial_search(toy.target, toy.ref, steps=300)
    assert (per_row["n_within_eps"] >= 1).all()
    assert per_row["eps_max_jsd"].min() > 0.0
