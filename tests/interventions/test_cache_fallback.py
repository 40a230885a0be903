"""The reference run falls back to the prefix re-run only when the target says its cached
step cannot be taken; any other error in the cached path propagates."""

from __future__ import annotations

from dataclasses import replace

import pytest

from attnaudit.errors import TargetError
from attnaudit.interventions import reference_run
from attnaudit.interventions.reference_run import reference


@pytest.fixture(scope="module")
def date_target():
    from attnaudit_examples.date.target import make_target

    target = make_target(limit=2)
    assert target.decode_states is not None and target.decode_step is not None
    return target


def _stepping_raises(target, error: Exception):
    def step(*args: object):
        raise error

    return replace(target, decode_step=step)


def test_the_bundled_target_takes_the_cached_step(date_target):
    ref = reference(date_target, next(date_target.iter_batches()))
    assert ref.states is not None and ref.cache_note is None


@pytest.mark.parametrize("refusal", [TargetError("the cache cannot go back 2 positions"),
                                     NotImplementedError("no single step")])
def test_a_target_that_cannot_take_the_step_reruns_the_prefix_and_says_why(date_target,
                                                                            refusal):
    target = _stepping_raises(date_target, refusal)
    ref = reference(target, next(target.iter_batches()))
    assert ref.states is None
    assert ref.cache_note == (f"one cached step could not be taken: "
                              f"{type(refusal).__name__}: {refusal}")


@pytest.mark.parametrize("error", [RuntimeError("shape mismatch in the step"),
                                   AssertionError("planted"), KeyError("layer_3")])
def test_an_unexpected_error_in_the_target_step_propagates(date_target, error):
    target = _stepping_raises(date_target, error)
    with pytest.raises(type(error)):
        reference(target, next(target.iter_batches()))


def test_a_bug_in_attnaudits_own_cached_path_propagates(date_target, monkeypatch):
    def broken_select(state, index):
        raise RuntimeError("planted bug in selecting the cached rows")

    monkeypatch.setattr(reference_run, "select_state", broken_select)
    with pytest.raises(RuntimeError, match="planted bug"):
        reference(date_target, next(date_target.iter_batches()))
