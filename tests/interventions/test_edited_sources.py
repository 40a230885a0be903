"""Edited prompts of a decoder-only model run from the unedited pass's cache: leave-one-out
equals an independent computation (the checkpoint loaded again with the eager backend, each
edited prompt run whole, never through attnaudit), the faithfulness curves equal those of
whole passes, and the cached path is what ran (from the first edited position on)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attnaudit.attribution.loo import (
    edit_count,
    edit_sequences,
    leave_one_out,
    replacement_id,
)
from attnaudit.interventions.edited_sources import EditedSourcePasses, first_changes
from attnaudit.interventions.faithfulness import ranking, removal_curves
from attnaudit.interventions.reference_run import reference
from tests.helpers.tiny_targets import counting_starts

pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")

PROMPTS = [" ".join(f"w{5 + (3 * i + k) % 60}" for i in range(n)) for k, n in
           ((0, 14), (1, 6), (2, 11))]
TOL = 1e-5


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from attnaudit.targets.hf.loading import from_hf
    from tests.helpers.tiny_targets import eager_model, save_tiny

    folder = save_tiny("llama", tmp_path_factory.mktemp("llama"))
    target = from_hf(folder, PROMPTS, max_new_tokens=4)
    batch = next(target.iter_batches())
    return target, batch, reference(target, batch), eager_model("llama", folder)


def _eager_probs(model, ids, mask, emitted) -> torch.Tensor:
    """(T, V) float64: the eager model's whole pass over prompt ``ids`` + emitted[:-1]."""
    seq = torch.cat([ids, emitted[:-1]])[None]
    full = torch.cat([mask.long(), torch.ones(len(emitted) - 1, dtype=torch.long)])[None]
    with torch.no_grad():
        out = model(input_ids=seq, attention_mask=full,
                    position_ids=(full.cumsum(-1) - 1).clamp_min(0))
    return torch.softmax(out.logits[0, -len(emitted):].double(), -1)


def test_first_changes():
    original = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]])
    edited = torch.tensor([[1, 9, 3, 9], [1, 2, 3, 4], [9, 2, 3, 4]])
    assert first_changes(original, edited).tolist() == [1, 4, 0]


def test_leave_one_out_from_the_cache_equals_whole_eager_passes(llama):
    target, batch, ref, eager = llama
    assert ref.states is not None
    counted, starts = counting_starts(target)
    loo = leave_one_out(counted, batch, ref.emitted, reference_probs=ref.probs,
                        states=ref.states)
    assert starts and max(starts) > 0  # chunks ran from a later position
    token = replacement_id(target, batch, "pad")
    explain, steps = target.explain_keys(batch), target.step_mask(ref.emitted)
    for b in range(len(batch)):
        ids, mask, emitted = batch.source_ids[b], batch.source_mask[b], ref.emitted[b]
        plain = _eager_probs(eager, ids, mask, emitted)
        for j in explain[b].nonzero().flatten().tolist():
            edited = ids.clone()
            edited[j] = token
            moved = 0.5 * (_eager_probs(eager, edited, mask, emitted) - plain).abs().sum(-1)
            expected = moved * steps[b].double()
            torch.testing.assert_close(loo[b, :, j].double(), expected, atol=TOL, rtol=0)


def test_faithfulness_curves_from_the_cache_equal_whole_passes(llama):
    target, batch, ref, _ = llama
    rows = ref.rows()
    eligible = ref.eligible[rows.example, rows.step]
    scores = torch.arange(eligible.shape[-1], dtype=torch.float32).expand_as(eligible)
    orders = torch.stack([ranking(scores, eligible), ranking(-scores, eligible)], 1)
    token = replacement_id(target, batch, "pad")
    counted, starts = counting_starts(target)
    cached = removal_curves(counted, ref, rows, orders, token, chunk_size=3)
    assert starts and max(starts) > 0
    whole = removal_curves(dataclasses.replace(target, teacher_forced_from=None), ref, rows,
                           orders, token, chunk_size=3)
    torch.testing.assert_close(cached.comprehensiveness, whole.comprehensiveness,
                               atol=TOL, rtol=0)
    torch.testing.assert_close(cached.sufficiency, whole.sufficiency, atol=TOL, rtol=0)


def _assert_falls_back(target, batch, ref, cached_from) -> None:
    """Edited copies of every example (the last key but one replaced) through a cached path
    ``cached_from`` (a ``teacher_forced_from``): whole passes' logits, and the cache off."""
    passes = EditedSourcePasses(dataclasses.replace(target, teacher_forced_from=cached_from),
                                batch, ref.states)
    ids = batch.source_ids.clone()
    ids[:, -2] = replacement_id(target, batch, "pad")
    got = passes.logits(torch.arange(len(batch)), ids, ref.emitted)
    whole = target.teacher_forced(dataclasses.replace(batch, source_ids=ids), ref.emitted)
    torch.testing.assert_close(got, whole)
    assert not passes.cached


def test_a_cached_pass_that_disagrees_falls_back_to_whole_passes(llama):
    target, batch, ref, _ = llama

    def wrong(batch, states, emitted, start):  # a cache that is not the batch's
        return target.teacher_forced(batch, emitted) + 5.0 * torch.randn(
            len(batch), emitted.shape[1], ref.probs.shape[-1], generator=torch.Generator()
            .manual_seed(0))

    _assert_falls_back(target, batch, ref, wrong)


def test_a_cached_pass_wrong_beyond_its_first_row_falls_back_to_whole_passes(llama):
    """The check runs the chunk's last copy alone: a cached path that misplaces the rows
    after the first (a state selection off by one) is caught there."""
    target, batch, ref, _ = llama

    def shifted(batch, states, emitted, start):  # row 0 right, the others its neighbours'
        out = target.teacher_forced_from(batch, states, emitted, start)
        return torch.cat([out[:1], out[:-1]])

    _assert_falls_back(target, batch, ref, shifted)


@pytest.mark.parametrize("window", [1, 2])
def test_the_plans_leave_one_out_sequences_are_the_positions_it_runs(llama, window):
    """edit_sequences (the plan's price of leave-one-out) equals the positions the run's
    passes hold, counted call by call, in whole sequences of prompt + steps positions."""
    target, batch, ref, _ = llama
    ran: list[tuple[int, int]] = []  # (copies, first position run) per call
    inner_from, inner_whole = target.teacher_forced_from, target.teacher_forced

    def counted_from(edited, states, emitted, start):
        ran.append((len(edited), start))
        return inner_from(edited, states, emitted, start)

    def counted_whole(edited, emitted):
        ran.append((len(edited), 0))
        return inner_whole(edited, emitted)

    counted = dataclasses.replace(target, teacher_forced_from=counted_from,
                                  teacher_forced=counted_whole)
    leave_one_out(counted, batch, ref.emitted, reference_probs=ref.probs, states=ref.states,
                  window=window)
    width, steps = batch.source_ids.shape[1], ref.emitted.shape[1]
    positions = sum(copies * (width + steps - start) for copies, start in ran)
    assert any(start > 0 for _, start in ran)
    planned = edit_sequences(target, batch, ref.states, window,
                             vocab=int(ref.probs.shape[-1]), steps=int(steps), max_memory=None)
    assert planned == pytest.approx(positions / (width + steps))
    assert planned < edit_count(target.explain_keys(batch), window)  # fewer than whole ones
