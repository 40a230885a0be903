"""What every intervention protocol and attribution method promises, checked on each: a run
that fails midway (the model raising inside an edited forward pass) propagates the failure
and leaves the model, torch's attention functions and capture exactly as they were; and the
rows a protocol reports never include a degenerate row.

The protocols are every registered one (:func:`registered_protocols`, the attribution
protocol included), made cheaper where their settings allow; :func:`check_failing_midway`
and :func:`check_no_degenerate_row` are the checks, which a test of a newly registered
protocol calls too (tests/interventions/test_protocol_registry.py)."""

from __future__ import annotations

from dataclasses import is_dataclass, replace

import pytest
import torch
import torch.nn.functional as F

import attnaudit.auditing.intervention_suite  # noqa: F401  (registers the attribution protocol)
from attnaudit.attribution.loo import leave_one_out
from attnaudit.attribution.methods import attribute
from attnaudit.attribution.options import ALL_METHODS, AttributionOptions
from attnaudit.capturing.state import ACTIVE
from attnaudit.interventions.protocol import (
    EVERY_ROW,
    BatchContext,
    InterventionProtocol,
    SuiteSettings,
)
from attnaudit.interventions.reference_run import Reference, reference
from attnaudit.interventions.registry import registered_protocols
from attnaudit.targets.contract import Seq2SeqTarget
from tests.helpers.fingerprints import assert_unchanged, model_fingerprint
from tests.helpers.toys.masking import make_target
from tests.interventions.test_degenerate import degenerate_target, expected_degenerate

# Cheaper settings of the protocols that have them (fewer draws, fewer optimiser steps).
CHEAPER = {"cumulative": {"random_draws": 2}, "adversarial": {"steps": 5}}


def cheaper(protocol: InterventionProtocol) -> InterventionProtocol:
    settings = CHEAPER.get(protocol.name)
    return replace(protocol, **settings) if settings and is_dataclass(protocol) else protocol


def contract_protocols() -> dict[str, InterventionProtocol]:
    """Every registered protocol by name, as the contract checks run it."""
    return {p.name: cheaper(p) for p in registered_protocols()}


def run_alone(protocol: InterventionProtocol, target: Seq2SeqTarget, ref: Reference
              ) -> dict:
    """``protocol``'s tables on ``ref``'s batch, on every counted row, in full mode with 4
    permutations and the first two attribution methods."""
    settings = SuiteSettings(quick=False, n_examples=len(ref.batch), seed=target.seed,
                             n_permutations=4, cumulative_examples=len(ref.batch),
                             adversarial_examples=len(ref.batch), progress=False,
                             attribution=AttributionOptions(),
                             methods=("saliency", "input_x_gradient"))
    ctx = BatchContext(target, ref.batch, ref, ref.rows(), settings,
                       frozenset(contract_protocols()), {}, {}, {})
    return protocol.run(ctx)


class ModelFailed(RuntimeError):
    """Raised by the model's own code in the middle of a protocol."""


def failing(target: Seq2SeqTarget) -> Seq2SeqTarget:
    """``target`` whose every forward entry point raises ModelFailed."""

    def fail(*args: object) -> torch.Tensor:
        raise ModelFailed("the model failed inside an edited pass")

    entry = {name: fail for name in ("greedy", "teacher_forced", "decode", "decode_step")
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


def check_failing_midway(protocol: InterventionProtocol, target: Seq2SeqTarget) -> None:
    """The unedited run succeeds, the edited ones fail: the failure propagates and nothing
    is left changed."""
    batch = next(target.iter_batches(3))
    ref = reference(target, batch)
    before, functions = model_fingerprint(target.model), attention_functions()
    with pytest.raises(ModelFailed):
        run_alone(protocol, failing(target), ref)
    assert_left_as_it_was(target, before, functions)


@pytest.mark.parametrize("protocol", list(contract_protocols()))
def test_a_protocol_failing_midway_propagates_and_leaves_everything_as_it_was(target, protocol):
    check_failing_midway(contract_protocols()[protocol], target)


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


def check_no_degenerate_row(protocol: InterventionProtocol) -> None:
    """Degenerate rows from the sources alone (test_degenerate's expectation): each of the
    protocol's row tables reports counted rows only, an EVERY_ROW protocol exactly them."""
    target = degenerate_target()
    expected = expected_degenerate(target)
    counted = {(e, s) for e, s, reason in
               expected[["example", "step", "reason"]].itertuples(index=False) if not reason}
    reported: dict[str, set[tuple[int, int]]] = {name: set() for name in protocol.row_tables}
    first = 0
    for batch in target.iter_batches():
        tables = run_alone(protocol, target, reference(target, batch, first_example=first))
        for name in protocol.row_tables:
            rows = tables[name]
            reported[name] |= set(zip(rows["example"].astype(int), rows["step"].astype(int),
                                      strict=True))
        first += len(batch)
    for rows in reported.values():
        assert rows <= counted
        assert rows == counted or protocol.scope != EVERY_ROW


ROW_PROTOCOLS = [name for name, p in contract_protocols().items() if p.row_tables]


def test_the_row_protocols_include_every_built_in_one():
    assert {"permutation", "uniform", "zeroing", "values", "cumulative",
            "adversarial"} <= set(ROW_PROTOCOLS)


@pytest.mark.parametrize("protocol", ROW_PROTOCOLS)
def test_no_protocol_reports_a_degenerate_row(protocol):
    check_no_degenerate_row(contract_protocols()[protocol])
