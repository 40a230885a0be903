"""The uniform baseline as Wiegreffe & Pinter (2019) define it: ``1 / n_valid`` on every
eligible key and 0 on every ineligible key (padding, special tokens such as source
``</s>``); and the named variant ``uniform_mass`` (the eligible mass spread evenly, the
weight on ineligible keys left in place). Expected rows are built here by hand loops in
numpy; expected output changes by a hand-written edit at the model's own call."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnaudit
from attnaudit.interventions.ablation import uniform_mass_rows, uniform_rows, uniform_test
from attnaudit.interventions.reference_run import reference

SITE = "model.decoder.layers.1.encoder_attn:cross"


def _paper(row: np.ndarray, eligible: np.ndarray) -> np.ndarray:
    n_valid = int(eligible.sum())
    return np.array([1.0 / n_valid if ok else 0.0 for ok in eligible])


def _mass(row: np.ndarray, eligible: np.ndarray) -> np.ndarray:
    mass = sum(w for w, ok in zip(row, eligible, strict=True) if ok)
    return np.array([mass / eligible.sum() if ok else w
                     for w, ok in zip(row, eligible, strict=True)])


def test_the_issue_example():
    old = torch.tensor([[[0.5, 0.3, 0.2]]])
    eligible = torch.tensor([[True, True, False]])
    assert uniform_rows(old, eligible).tolist() == [[[0.5, 0.5, 0.0]]]
    np.testing.assert_allclose(uniform_mass_rows(old, eligible).numpy(), [[[0.4, 0.4, 0.2]]],
                               atol=1e-7)


def test_random_rows_match_hand_loops():
    gen = torch.Generator().manual_seed(0)
    old = torch.softmax(torch.randn(7, 3, 9, generator=gen), -1)
    eligible = torch.rand(7, 9, generator=gen) > 0.4
    eligible[0] = False  # a row without eligible keys is left as it is
    eligible[1] = True
    got, got_mass = uniform_rows(old, eligible), uniform_mass_rows(old, eligible)
    for m in range(7):
        keys = eligible[m].numpy()
        for h in range(3):
            row = old[m, h].double().numpy()
            if not keys.any():
                np.testing.assert_allclose(got[m, h].numpy(), row, atol=1e-7)
                continue
            np.testing.assert_allclose(got[m, h].numpy(), _paper(row, keys), atol=1e-7)
            np.testing.assert_allclose(got_mass[m, h].numpy(), _mass(row, keys), atol=1e-6)
            assert got[m, h].sum() == pytest.approx(1.0, abs=1e-6)


@pytest.fixture(scope="module")
def bart_target():
    pytest.importorskip("transformers")
    from attnaudit_examples.date_transformer.target import make_target

    return make_target()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_date_bart_uniform_tvd_equals_a_hand_written_edit(bart_target):
    """On the date BART (source ``</s>`` is a special token, so ineligible, and takes
    weight): uniform_tvd is the TVD under weights 1/n_valid on the eligible keys and 0 on
    ``</s>`` and padding, every head of the site; uniform_mass_tvd under the variant."""
    batch = next(bart_target.iter_batches(3))
    ref = reference(bart_target, batch, sites=[SITE])
    got = uniform_test(bart_target, ref)
    explain = bart_target.explain_keys(batch)
    moved = 0
    for row in got.sample(8, random_state=1).itertuples():
        b, t = int(row.example), int(row.step)
        src, emitted = batch.select([b]), ref.emitted[b : b + 1, : t + 1]
        keys = explain[b].numpy()
        with torch.no_grad():
            before = torch.softmax(bart_target.teacher_forced(src, emitted)[0, t].double(), -1)
        for column, rule in (("uniform_tvd", _paper), ("uniform_mass_tvd", _mass)):

            def edit(site, weights, key_mask, t=t, keys=keys, rule=rule):
                new = weights.clone()
                for h in range(new.shape[1]):
                    line = new[0, h, t].double().numpy()
                    new[0, h, t] = torch.from_numpy(rule(line, keys)).to(new.dtype)
                return new

            with torch.no_grad(), attnaudit.capture(bart_target.model, sites=[SITE],
                                                    edit=edit):
                after = torch.softmax(bart_target.teacher_forced(src, emitted)[0, t].double(),
                                      -1)
            expected = 0.5 * float((before - after).abs().sum())
            assert getattr(row, column) == pytest.approx(expected, abs=1e-5)
        moved += abs(row.uniform_tvd - row.uniform_mass_tvd) > 1e-6
    assert moved > 0  # the definitions differ where </s> takes weight
