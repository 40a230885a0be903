"""What every intervention protocol and attribution method promises, checked on each: a run
that fails midway (the model raising inside an edited forward pass) propagates the failure
and leaves the model, torch's attention functions and capture exactly as they were; and the
rows a protocol reports never include a degenerate row."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from attnaudit.attribution.loo import leave_one_out
from attnaudit.attribution.methods import attribute
from attnaudit.attribution.options import ALL_METHODS
from attnaudit.capturing.state import ACTIVE
from attnaudit.interventions.ablation import cumulative_test, uniform_test, zeroing_test
from attnaudit.interventions.adversarial import adversarial_search
from attnaudit.interventions.permutation import permutation_test
from attnaudit.interventions.reference_run import reference
from attnaudit.interventions.values import value_replacement
from attnaudit.targets.contract import Seq2SeqTarget
from tests.helpers.fingerprints import assert_unchanged, model_fingerprint
from tests.helpers.toys.masking import make_target
from tests.interventions.test_degenerate import degenerate_target, expected_degenerate

PROTOCOLS: dict[str, Callable[..., pd.DataFrame]] = {
    "permutation": lambda t, r: permutation_test(t, r, n_permutations=4),
    "uniform": uniform_test,
    "zeroing": zeroing_test,
    "values": lambda t, r: value_replacement(t, r)[0],
    "cumulative": lambda t, r: cumulative_test(t, r, random_draws=2),
    "adversarial": lambda t, r: adversarial_search(t, r, steps=5)[1],
}


class ModelFailed(RuntimeError):
    """Raised by the model's own code in the middle of a protocol."""


def failing(target: Seq2SeqTarget) -> Seq2SeqTarget:
    """``target`` whose every forward entry point raises ModelFailed."""

    def fail(*args: object) -> torch.Tensor:
        raise ModelFailed("the model failed inside an edited pass")

    entry = {name: fail for name in ("teacher_forced", "decode", "decode_step")
             if getattr(target, name) is not None}
    return replace(target, **entry)


def attention_functions() -> tuple[object, ...]:
    return (torch.softmax, F.softmax, torch.Tensor.softmax, F.scaled_dot_product_attention,
            F.multi_head_attention_forward, torch.nn.MultiheadAttention.forward)


@pytest.fixture(scope="module", params=["toy", "date_bart"])
def target(request) -> Seq2SeqTarget:
    if request.param == "toy":
        return make_target("correct")
    from attnaudit_examples.date_transformer.target import make_target as date_bart

    return date_bart()  # iter_batches(3): its first three sources


def assert_left_as_it_was(target: Seq2SeqTarget, before: dict, functions: tuple) -> None:
    assert_unchanged(target.model, before)
    assert attention_functions() == functions
    assert ACTIVE.capture is None


@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_a_protocol_failing_midway_propagates_and_leaves_everything_as_it_was(target, protocol):
    batch = next(target.iter_batches(3))
    ref = reference(target, batch)  # the unedited run succeeds; the edited ones fail
    before, functions = model_fingerprint(target.model), attention_functions()
    with pytest.raises(ModelFailed):
        PROTOCOLS[protocol](failing(target), ref)
    assert_left_as_it_was(target, before, functions)


@pytest.mark.parametrize("method", [*ALL_METHODS, "leave_one_out"])
def test_an_attribution_failing_midway_propagates_and_leaves_everything_as_it_was(target,
                                                                                method):
    batch = next(target.iter_batches(3))
    emitted = target.greedy(batch)
    before, functions = model_fingerprint(target.model), attention_functions()
    with pytest.raises(ModelFailed):
        if method == "leave_one_out":
            leave_one_out(failing(target), batch, emitted)
        else:
            attribute(failing(target), batch, emitted, (method,), n_steps=4, shap_samples=2)
    assert_left_as_it_was(target, before, functions)


PER_ROW = ("permutation", "uniform", "zeroing", "values")  # one result per counted row


@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_no_protocol_reports_a_degenerate_row(protocol):
    """Degenerate rows from the sources alone (test_degenerate's expectation): a per-row
    protocol reports exactly the other rows, the rest a subset of them."""
    target = degenerate_target()
    expected = expected_degenerate(target)
    counted = {(e, s) for e, s, reason in
               expected[["example", "step", "reason"]].itertuples(index=False) if not reason}
    reported: set[tuple[int, int]] = set()
    first = 0
    for batch in target.iter_batches():
        rows = PROTOCOLS[protocol](target, reference(target, batch, first_example=first))
        reported |= set(zip(rows["example"].astype(int), rows["step"].astype(int),
                            strict=True))
        first += len(batch)
    assert reported <= counted
    assert reported == counted or protocol not in PER_ROW
