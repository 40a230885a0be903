"""Interventions on chosen heads of a chosen layer, against a hand-written edit."""

import pytest
import torch

import attnaudit
from attnaudit.interventions.ablation import uniform_test
from attnaudit.interventions.runner import InterventionError, reference

SITE = "model.decoder.layers.1.encoder_attn:cross"
HEAD = 2


@pytest.fixture(scope="module")
def bart_target():
    pytest.importorskip("transformers")
    from examples.date_transformer.target import make_target

    return make_target()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_uniform_on_one_head_matches_hand_written_edit(bart_target):
    batch = next(bart_target.iter_batches(2))
    ref = reference(bart_target, batch, sites=[SITE], heads=[HEAD])
    assert ref.heads == {SITE: 1} and ref.head_index == (HEAD,)
    got = uniform_test(bart_target, ref)
    assert got["uniform_tvd"].max() > 1e-3  # the edit does move the output
    model = bart_target.model
    explain = bart_target.explain_keys(batch)
    for row in got.sample(6, random_state=0).itertuples():
        b, t = int(row.example), int(row.step)
        src = batch.select([b])
        emitted = ref.emitted[b : b + 1, : t + 1]
        keys = explain[b]

        def edit(site, weights, key_mask, t=t, keys=keys):
            new = weights.clone()
            line = new[0, HEAD, t]
            line[keys] = line[keys].sum() / keys.sum()  # eligible mass spread evenly
            return new

        with torch.no_grad():
            before = torch.softmax(bart_target.teacher_forced(src, emitted)[0, t], -1)
            with attnaudit.capture(model, sites=[SITE], edit=edit):
                after = torch.softmax(bart_target.teacher_forced(src, emitted)[0, t], -1)
        expected = 0.5 * (before - after).abs().sum().item()
        assert row.uniform_tvd == pytest.approx(expected, abs=1e-5)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_bad_head_index_is_a_clear_error(bart_target):
    batch = next(bart_target.iter_batches(1))
    with pytest.raises(InterventionError, match="4 head"):
        reference(bart_target, batch, sites=[SITE], heads=[4])
