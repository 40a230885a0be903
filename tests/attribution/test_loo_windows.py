"""Windowed leave-one-out (the quick audit's on long prompts) against windows replaced by
hand: each window's ids set to the pad token in a copy of the batch, the model's own
forward run on it (the date LSTM's ``teacher_forced``; a tiny Llama loaded again with the
eager backend, never through attnaudit) and the TVD computed in numpy. Window 1 is
leave-one-out itself; the cached prefix gives what whole passes give; the quick attribution
protocol's cost counts the edits it runs."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from attnaudit.attribution.loo import (
    QUICK_LOO_EDITS,
    QUICK_LOO_MIN_EDITS,
    QUICK_LOO_MULTIPLY_ADDS,
    audit_window,
    edit_count,
    leave_one_out,
    quick_edits,
    quick_window,
    replacement_id,
)
from attnaudit.errors import InterventionError
from attnaudit.interventions.edited_sources import EditedSourcePasses
from attnaudit.interventions.reference_run import reference
from attnaudit.targets.contract import Batch, Seq2SeqTarget
from tests.helpers.tiny_targets import counting_starts, prompt_inputs

TOL = 1e-5
# three prompts of a tiny Llama: 26, 9 and 22 words (more than QUICK_LOO_EDITS eligible
# keys in two of them), 4 new tokens: within its 32 positions
PROMPTS = [" ".join(f"w{5 + (7 * i + k) % 60}" for i in range(n)) for k, n in
           ((0, 26), (1, 9), (2, 22))]


def hand_windows(eligible: np.ndarray, window: int) -> list[np.ndarray]:
    """An example's windows: its eligible key positions (in order) cut every ``window``."""
    keys = np.flatnonzero(eligible)
    return [keys[i : i + window] for i in range(0, len(keys), window)]


def windowed_by_hand(probs, eligible: np.ndarray, steps: np.ndarray, windows: list[int]
                     ) -> np.ndarray:
    """(B, T, n) float64: every key of a window gets the TVD of the window replaced at once.
    probs(b, keys): (T, V) float64 probabilities of example ``b`` with ``keys`` replaced
    (none: unedited)."""
    n_examples, n_keys = eligible.shape
    out = np.zeros((n_examples, steps.shape[1], n_keys))
    for b in range(n_examples):
        plain = probs(b, np.array([], dtype=np.int64))
        for keys in hand_windows(eligible[b], windows[b]):
            moved = 0.5 * np.abs(probs(b, keys) - plain).sum(-1) * steps[b]
            out[b][:, keys] = moved[:, None]
    return out


# --------------------------------------------------------------------- the rule, by hand


def test_quick_window_caps_the_edits():
    assert [quick_window(n) for n in (0, 1, 20, 21, 40, 41, 96)] == [1, 1, 1, 2, 2, 3, 5]
    assert QUICK_LOO_EDITS == 20
    for n in range(1, 300):
        assert math.ceil(n / quick_window(n)) <= QUICK_LOO_EDITS
    eligible = torch.zeros(3, 100, dtype=torch.bool)
    eligible[0, :96] = True  # windows of 5: 20 edits
    eligible[1, 3:10] = True  # 7 keys alone
    eligible[2, ::4] = True  # 25 keys, windows of 2: 13 edits
    assert edit_count(eligible, quick_window) == 20 + 7 + 13
    assert edit_count(eligible, 1) == 96 + 7 + 25
    assert edit_count(eligible, 4) == 24 + 2 + 7


def test_a_large_model_gets_fewer_quick_edits_as_its_budget_buys():
    """20 edits up to 10^12 multiply-adds for 20 sequences; fewer beyond, never under 8."""
    assert QUICK_LOO_EDITS == 20 and QUICK_LOO_MIN_EDITS == 8
    assert quick_edits(0.0) == quick_edits(270_000 * 30) == 20  # the date LSTM
    assert quick_edits(QUICK_LOO_MULTIPLY_ADDS / 20) == 20
    assert quick_edits(QUICK_LOO_MULTIPLY_ADDS / 12) == 12
    assert quick_edits(1.24e9 * 102) == 8  # a 1B model: 7 would fit, the floor is 8
    assert quick_edits(1e15) == 8
    window = audit_window(True, QUICK_LOO_MULTIPLY_ADDS / 12)
    assert callable(window) and [window(n) for n in (12, 13, 96)] == [1, 2, 8]
    assert audit_window(True, 1.0) is quick_window and audit_window(False, 1e15) == 1
    eligible = torch.zeros(1, 100, dtype=torch.bool)
    eligible[0, :96] = True
    assert edit_count(eligible, window) == 12


# --------------------------------------------------------------------- the date LSTM


@pytest.fixture(scope="module")
def date():
    from attnaudit_examples.date.target import make_target

    target = make_target(limit=4)
    batch = next(target.iter_batches())
    return target, batch, target.greedy(batch)


def _date_probs(target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor, token: int):
    def probs(b: int, keys: np.ndarray) -> np.ndarray:
        ids = batch.source_ids[b : b + 1].clone()
        ids[0, torch.as_tensor(keys, dtype=torch.long)] = token
        one = dataclasses.replace(batch.select([b]), source_ids=ids)
        with torch.no_grad():
            logits = target.teacher_forced(one, emitted[b : b + 1])
        return torch.softmax(logits[0].double(), -1).numpy()
    return probs


@pytest.mark.parametrize(("window", "chunk_size"), [(3, None), (4, 2), (7, 3)])
def test_date_windows_equal_windows_replaced_by_hand(date, window, chunk_size):
    target, batch, emitted = date
    eligible = target.explain_keys(batch).numpy()
    assert (eligible.sum(1) % 4 != 0).any()  # some last window is shorter
    got = leave_one_out(target, batch, emitted, window=window, chunk_size=chunk_size)
    token = replacement_id(target, batch, "pad")
    expected = windowed_by_hand(_date_probs(target, batch, emitted, token), eligible,
                                target.step_mask(emitted).double().numpy(),
                                [window] * len(batch))
    np.testing.assert_allclose(got.numpy(), expected, atol=TOL, rtol=0)
    assert got.gt(0).any()


def test_date_window_one_and_the_quick_window_are_leave_one_out(date):
    target, batch, emitted = date
    assert int(target.explain_keys(batch).sum(1).max()) <= QUICK_LOO_EDITS
    exact = leave_one_out(target, batch, emitted)
    torch.testing.assert_close(leave_one_out(target, batch, emitted, window=1), exact,
                               atol=0, rtol=0)
    torch.testing.assert_close(leave_one_out(target, batch, emitted, window=quick_window),
                               exact, atol=0, rtol=0)
    token = replacement_id(target, batch, "pad")
    expected = windowed_by_hand(_date_probs(target, batch, emitted, token),
                                target.explain_keys(batch).numpy(),
                                target.step_mask(emitted).double().numpy(), [1] * len(batch))
    np.testing.assert_allclose(exact.numpy(), expected, atol=TOL, rtol=0)


def test_a_window_per_example_and_bad_windows(date):
    target, batch, emitted = date
    counts = target.explain_keys(batch).sum(1).tolist()
    assert len({2 + n % 3 for n in counts}) > 1  # examples get different windows
    got = leave_one_out(target, batch, emitted, window=lambda n: 2 + n % 3)
    token = replacement_id(target, batch, "pad")
    expected = windowed_by_hand(_date_probs(target, batch, emitted, token),
                                target.explain_keys(batch).numpy(),
                                target.step_mask(emitted).double().numpy(),
                                [2 + n % 3 for n in counts])
    np.testing.assert_allclose(got.numpy(), expected, atol=TOL, rtol=0)
    for bad in (0, -1, True, lambda n: 0):
        with pytest.raises(InterventionError, match="positive number of keys"):
            leave_one_out(target, batch, emitted, window=bad)  # type: ignore[arg-type]


# --------------------------------------------------------------------- a tiny Llama


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    pytest.importorskip("transformers")
    from attnaudit.targets.hf.loading import from_hf
    from tests.helpers.tiny_targets import eager_model, save_tiny

    folder = save_tiny("llama", tmp_path_factory.mktemp("llama"))
    target = from_hf(folder, PROMPTS, max_new_tokens=4)
    batch = next(target.iter_batches())
    return target, batch, reference(target, batch), eager_model("llama", folder)


def _eager_probs(model: torch.nn.Module, batch: Batch, emitted: torch.Tensor, token: int):
    def probs(b: int, keys: np.ndarray) -> np.ndarray:
        ids = batch.source_ids[b : b + 1].clone()
        ids[0, torch.as_tensor(keys, dtype=torch.long)] = token
        one = SimpleNamespace(source_ids=ids, source_mask=batch.source_mask[b : b + 1])
        with torch.no_grad():
            logits = model(**prompt_inputs(one, emitted[b : b + 1])).logits
        return torch.softmax(logits[0, -emitted.shape[1]:].double(), -1).numpy()
    return probs


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")
@pytest.mark.parametrize("window", [quick_window, 3])
def test_llama_windows_from_the_cache_equal_eager_passes(llama, window):
    target, batch, ref, eager = llama
    eligible = target.explain_keys(batch)
    assert int(eligible.sum(1).max()) > QUICK_LOO_EDITS
    assert ref.states is not None
    counted, starts = counting_starts(target)
    cached = leave_one_out(counted, batch, ref.emitted, reference_probs=ref.probs,
                           states=ref.states, window=window)
    assert starts and max(starts) > 0  # chunks ran from a later position
    whole = leave_one_out(target, batch, ref.emitted, reference_probs=ref.probs,
                          window=window)
    torch.testing.assert_close(cached, whole, atol=TOL, rtol=0)
    sizes = [window(int(n)) if callable(window) else window for n in eligible.sum(1)]
    assert max(sizes) > 1
    token = replacement_id(target, batch, "pad")
    expected = windowed_by_hand(_eager_probs(eager, batch, ref.emitted, token),
                                eligible.numpy(), target.step_mask(ref.emitted).double().numpy(),
                                sizes)
    np.testing.assert_allclose(cached.numpy(), expected, atol=TOL, rtol=0)


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")
@pytest.mark.parametrize("quick", [True, False])
def test_the_attribution_protocol_costs_the_edits_it_runs(llama, monkeypatch, quick):
    from attnaudit.auditing.attribution_protocol import ATTRIBUTION
    from attnaudit.auditing.intervention_suite import suite_plan
    from attnaudit.interventions.protocol import BatchContext

    target, batch, ref, _ = llama
    batches, settings, _, _, planned = suite_plan(
        target, quick=quick, limit=None, progress=False, n_permutations=None,
        cumulative_examples=0, adversarial_examples=0, attribution=None,
        sequence_effects=False)
    assert len(batches) == 1 and len(batches[0]) == len(batch)
    protocol = next(p for p, _ in planned if p.name == ATTRIBUTION)
    facts: dict = {}
    ctx = BatchContext(target, batch, ref, ref.rows(), settings,
                       frozenset(p.name for p, _ in planned), {}, {}, facts)
    cost = protocol.cost(ctx)
    edited: list[int] = []
    logits = EditedSourcePasses.logits

    def counted(self, rows, ids, emitted):
        edited.append(len(rows))
        return logits(self, rows, ids, emitted)

    monkeypatch.setattr(EditedSourcePasses, "logits", counted)
    protocol.run(ctx)
    counts = target.explain_keys(batch).sum(1).tolist()
    windows = [quick_window(n) if quick else 1 for n in counts]
    expected = sum(math.ceil(n / w) for n, w in zip(counts, windows, strict=True))
    assert sum(edited) == expected
    assert (expected < sum(counts)) == quick  # the quick audit's windows run fewer edits
    assert cost.items - len(batch) * len(settings.methods) == expected
    assert max(facts["loo_windows"]) == max(windows)
    text = protocol.metadata(settings, None, facts)["leave_one_out_window"]
    assert (f"largest window: {max(windows)}" in text) == quick
    assert text.startswith("ceil(n_eligible / E)" if quick else "1 (every key alone)")
    assert ("here E = 20" in text) == quick  # a tiny model: every one of the 20 edits
