"""Edited items run as one cached decoder step give what re-running the prefix gives.

The re-run path (``reference(..., incremental=False)``) is the independent computation:
the whole decoder prefix 0..t runs under the edit, as before the cached path existed. On a
tiny Llama (grouped-query attention, prompts of different lengths) the cached path folds
items of different steps into one call (``decode_steps``: later steps' cached positions
masked for a row at an earlier one), which must give the same numbers.
"""

from __future__ import annotations

import pytest
import torch

from attnaudit.interventions import runner
from attnaudit.interventions.ablation import (
    cumulative_test,
    uniform_test,
    weight_gradients,
    zeroing_test,
)
from attnaudit.interventions.adversarial import adversarial_search
from attnaudit.interventions.permutation import permutation_test
from attnaudit.interventions.reference_run import reference
from attnaudit.interventions.values import value_replacement

PROTOCOLS = {
    "permutation": lambda t, ref: permutation_test(t, ref, n_permutations=3),
    "uniform": uniform_test,
    "zeroing": zeroing_test,
    "values": value_replacement,
    "cumulative": lambda t, ref: cumulative_test(t, ref, ref.rows().select(torch.arange(6)),
                                                 random_draws=1),
}


LLAMA_PROMPTS = ["w5 w6 w7 w8 w9", "w10 w11", "w12 w13 w14 w15"]


def _target(model: str, tmp_path_factory: pytest.TempPathFactory):
    if model == "date":
        from attnaudit_examples.date.target import make_target
        return make_target(limit=3)
    pytest.importorskip("transformers")
    if model == "llama":
        import attnaudit
        from tests.helpers.tiny_targets import save_tiny
        folder = save_tiny("llama", tmp_path_factory.mktemp("llama"))
        return attnaudit.from_hf(folder, LLAMA_PROMPTS, max_new_tokens=5)
    from attnaudit_examples.date_transformer.target import make_target
    return make_target()


@pytest.fixture(scope="module", params=["date", "date_transformer", "llama"])
def both_paths(request, tmp_path_factory):
    target = _target(request.param, tmp_path_factory)
    batch = next(target.iter_batches(3))
    cached = reference(target, batch)
    rerun = reference(target, batch, incremental=False)
    assert cached.states is not None and rerun.states is None
    assert cached.mixed_steps == (request.param == "llama")  # decode_steps, checked
    return target, cached, rerun


def _recorded(monkeypatch, target, ref, protocol) -> dict[int, tuple[int, int, torch.Tensor]]:
    """Item id -> (example, step, edited distribution) for each item of ``protocol``."""
    seen: dict[int, tuple[int, int, torch.Tensor]] = {}
    original = runner.edited_probs

    def recording(target, ref, example, step, row_edit, items):
        probs = original(target, ref, example, step, row_edit, items)
        for item, e, s, row in zip(items.tolist(), example.tolist(), step.tolist(), probs,
                                   strict=True):
            seen[item] = (e, s, row.detach().clone())
        return probs

    with monkeypatch.context() as patch:
        patch.setattr(runner, "edited_probs", recording)
        PROTOCOLS[protocol](target, ref)
    return seen


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_cached_step_equals_prefix_rerun(both_paths, monkeypatch, protocol):
    target, cached, rerun = both_paths
    a = _recorded(monkeypatch, target, cached, protocol)
    b = _recorded(monkeypatch, target, rerun, protocol)
    assert a.keys() == b.keys() and len(a) > 0
    assert all(a[i][:2] == b[i][:2] for i in a)
    worst = max(float((a[i][2] - b[i][2]).abs().max()) for i in a)
    assert worst <= 1e-5, f"{protocol}: max |dp| = {worst:.2e}"
    # the edits move the output somewhere, so agreeing is not agreeing on "unchanged"
    moved = max(float((p - cached.probs[e, s]).abs().max()) for e, s, p in a.values())
    assert moved > 1e-3, f"{protocol}: no edit changed the output"


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_gradient_and_adversarial_paths_agree(both_paths):
    target, cached, rerun = both_paths
    rows = cached.rows().select(torch.arange(4))
    torch.testing.assert_close(weight_gradients(target, cached, rows),
                               weight_gradients(target, rerun, rows), rtol=0, atol=1e-5)
    a_rows, a_cand = adversarial_search(target, cached, rows.select(torch.arange(2)), steps=3)
    b_rows, b_cand = adversarial_search(target, rerun, rows.select(torch.arange(2)), steps=3)
    for column in ("jsd_to_original", "output_tvd"):
        assert (a_cand[column] - b_cand[column]).abs().max() <= 1e-5, column
    assert (a_rows["min_tvd"] - b_rows["min_tvd"]).abs().max() <= 1e-5


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_cached_step_is_one_step_of_the_reference(both_paths):
    """Unedited, the cached step reproduces the reference distribution of every row."""
    target, cached, _ = both_paths
    rows = cached.rows()
    keep = runner.edited_probs(target, cached, rows.example, rows.step,
                               lambda site, old, items: old, torch.arange(len(rows)))
    expected = cached.probs[rows.example, rows.step]
    assert float((keep - expected).abs().max()) <= 1e-5


def test_items_of_every_later_step_share_one_cached_call(both_paths, monkeypatch):
    """On the Llama, the uniform edit of every row runs two calls (step 0, then the other
    steps together) where one call per step ran before."""
    target, cached, _ = both_paths
    if not cached.mixed_steps:
        pytest.skip("the target runs one step per call")
    calls = []
    for name in ("decode_step", "decode_steps"):
        original = getattr(target, name)

        def counted(*args, _original=original, _name=name):
            calls.append((_name, len(args[0])))
            return _original(*args)

        monkeypatch.setattr(target, name, counted)
    rows = cached.rows()
    uniform_test(target, cached, rows)
    assert len(set(rows.step.tolist())) > 2
    assert [name for name, _ in calls] == ["decode_step", "decode_steps"]
    assert sum(n for _, n in calls) == 2 * len(rows)  # the paper's edit and the variant
