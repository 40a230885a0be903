"""The plan counts what the suite runs: for every protocol whose cost is exact, its edited
items and forward passes equal those counted while it runs, on the bundled date LSTM
(one cached recurrent step per item), the bundled date BART and a tiny Llama (items of
every later step in one cached call); a protocol without a cost is planned as unknown."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import pandas as pd
import pytest

import attnaudit
from attnaudit.auditing.intervention_suite import suite_plan
from attnaudit.auditing.plan import plan_audit
from attnaudit.interventions import InterventionProtocol, register_protocol, unregister_protocol
from attnaudit.interventions.protocol import BATCH, BatchContext, Columns, subset_rows
from attnaudit.interventions.reference_run import reference
from attnaudit.options import AuditMode, AuditOptions
from attnaudit.targets.contract import Seq2SeqTarget
from attnaudit.validity import timing

CALLS = ("teacher_forced", "decode", "decode_step", "decode_steps")


def _date_lstm() -> Seq2SeqTarget:
    from attnaudit_examples.date.target import make_target
    return make_target(limit=3, batch_size=3)


def _date_bart() -> Seq2SeqTarget:
    from attnaudit_examples.date_transformer.target import make_target
    return make_target()


def _tiny_llama() -> Seq2SeqTarget:
    import tempfile
    from pathlib import Path

    from tests.helpers.tiny_targets import save_tiny

    folder = save_tiny("llama", Path(tempfile.mkdtemp()) / "llama")
    target = attnaudit.from_hf(folder, ["w5 w6 w7 w8 w9", "w10 w11", "w12 w13 w14 w15"],
                               max_new_tokens=5)
    assert target.decode_steps is not None
    return target


def _quick_suite(target: Seq2SeqTarget) -> tuple[Any, Any, Any]:
    """(batches, settings, planned protocols) of a quick suite on the first 2 examples."""
    batches, settings, _, _, planned = suite_plan(
        target, quick=True, limit=2, progress=False, n_permutations=None,
        cumulative_examples=50, adversarial_examples=2, attribution=None,
        sequence_effects=False)
    return batches, settings, planned


def _counting(target: Seq2SeqTarget, counts: dict[str, int]) -> dict[str, Any]:
    """Count the target's model calls (each one forward pass of a batch of sequences);
    returns the calls it replaced."""
    originals = {name: getattr(target, name) for name in CALLS}
    for name in CALLS:
        call = getattr(target, name)
        if call is None:
            continue

        def counted(*args: Any, _call: Callable[..., Any] = call, _name: str = name,
                    **kwargs: Any) -> Any:
            counts[_name] = counts.get(_name, 0) + 1
            return _call(*args, **kwargs)

        setattr(target, name, counted)
    return originals


@pytest.mark.parametrize("make", [_date_lstm, _date_bart, _tiny_llama],
                         ids=["date_lstm", "date_bart", "tiny_llama"])
def test_exact_costs_equal_the_passes_and_items_run(make):
    target = make()
    batches, settings, planned = _quick_suite(target)
    batch = batches[0]
    assert len(batches) == 1
    ref = reference(target, batch)
    counted = ref.rows()
    running = frozenset(p.name for p, _ in planned)
    checked = []
    for protocol, examples in planned:
        rows = counted if examples is None else subset_rows(ref, counted, examples)
        if protocol.scope != BATCH and not len(rows):
            continue
        ctx = BatchContext(target, batch, ref, rows, settings, running, {}, {}, {})
        cost = protocol.cost(ctx)
        assert cost is not None, protocol.name
        if not cost.exact:
            continue
        counts: dict[str, int] = {}
        originals = _counting(target, counts)
        tables = protocol.run(ctx)
        for name, call in originals.items():  # the next protocol counts afresh
            setattr(target, name, call)
        assert sum(counts.values()) == cost.forward, (protocol.name, counts, cost)
        per_row = tables["rows"]
        # items: one per (row, edited copy), from the tables the protocol wrote
        # uniform: the paper's and the eligible-mass variant; values: zero and mean at the
        # top key of every row and at the random other key of the rows that have one, and
        # another example's value at each of those with a donor
        copies = {"permutation": settings.n_permutations, "uniform": 2, "zeroing": 2,
                  "values": 2}[protocol.name]
        expected = copies * len(per_row)
        if protocol.name == "values":
            expected += 2 * int(per_row["value_zero_random_tvd"].notna().sum())
            expected += sum(int((per_row[f"value_other_example{s}_donor"] >= 0).sum())
                            for s in ("", "_random"))
        assert cost.items == expected, protocol.name
        checked.append(protocol.name)
    assert set(checked) == {"permutation", "uniform", "zeroing", "values"}


def test_the_plan_scales_to_the_data_and_states_unknown_costs():
    @register_protocol
    class Costless(InterventionProtocol):
        name = "costless"
        columns: ClassVar[Columns] = {"rows": ("costless",)}

        def run(self, ctx):
            return {"rows": pd.DataFrame()}

    try:
        plan = plan_audit(_date_lstm(), AuditOptions(mode=AuditMode.QUICK, limit=3))
    finally:
        unregister_protocol("costless")
    parts = {p.name: p for p in plan.protocols}
    assert parts["costless"].cost is None
    assert parts["uniform"].cost is not None and parts["uniform"].cost.exact
    assert 2 * parts["permutation"].cost.items == 20 * parts["uniform"].cost.items
    text = str(plan)
    assert "costless" in text and "unknown" in text and "3 examples in 1 batches" in text


def test_attnaudit_plan_takes_the_audit_keywords():
    plan = attnaudit.plan(_date_lstm(), quick=True, limit=2)
    assert plan.examples == 2 and plan.seconds > 0
    checks = attnaudit.plan(_date_lstm(), checks_only=True, limit=2)
    assert checks.protocols == ()


def test_the_suite_run_on_the_plans_reference_equals_one_run_without_a_plan(capsys,
                                                                            monkeypatch):
    """With progress the audit plans first, and its validity audit and suite take over the
    plan's reference run of the first batch (its greedy decoding, timed, is decoded once);
    the tables equal those of an audit without a plan."""
    decoded: list[int] = []
    # each timed pass runs as few times as asked (a millisecond decoding is otherwise timed
    # until its runs add up to a quarter second)
    monkeypatch.setattr(timing, "repeat_count", lambda first_s, least: least)

    def counted() -> Seq2SeqTarget:
        target = _date_lstm()
        greedy = target.greedy
        return target.with_options(greedy=lambda batch: decoded.append(len(batch))
                                   or greedy(batch))

    planned = attnaudit.audit(counted(), quick=True, limit=2, progress=True)
    assert "plan of audit" in capsys.readouterr().err
    assert decoded == [2]  # the plan's, and no other
    alone = attnaudit.audit(counted(), quick=True, limit=2, progress=False)
    assert decoded == [2, 2, 2]  # then the validity audit's and the suite's
    assert planned.suite is not None and alone.suite is not None
    performance = planned.validity.performance
    assert (performance["greedy_s"] > 0).all(), performance  # the plan's time, counted
    pd.testing.assert_frame_equal(planned.validity.metrics, alone.validity.metrics)
    for name in ("rows", "faithfulness_rows", "agreement", "cumulative"):
        pd.testing.assert_frame_equal(planned.suite.tables[name], alone.suite.tables[name],
                                      check_exact=False, atol=1e-6)


@pytest.mark.parametrize("make", [_date_lstm, _tiny_llama], ids=["date_lstm", "tiny_llama"])
def test_the_validity_audit_takes_over_the_plans_timed_pass_without_capture(capsys,
                                                                           monkeypatch, make):
    """The plan's timed teacher-forced pass of the first batch (it prices the protocols that
    run whole sequences) is the validity audit's first pass without capture: an audit with
    a plan runs as many passes without capture as one without, its performance row keeps
    that pass's time, and the cached decoding compared with its logits is the same."""
    from attnaudit.capturing.state import ACTIVE

    monkeypatch.setattr(timing, "repeat_count", lambda first_s, least: least)
    plain: list[int] = []

    def counted() -> Seq2SeqTarget:
        target = make()
        forced = target.teacher_forced
        return target.with_options(teacher_forced=lambda batch, emitted: (
            plain.append(len(batch)) if ACTIVE.capture is None else None)
            or forced(batch, emitted))

    planned = attnaudit.audit(counted(), quick=True, limit=2, progress=True)
    assert "per teacher-forced sequence" in capsys.readouterr().err  # the plan timed one
    with_plan, plain[:] = list(plain), []
    alone = attnaudit.audit(counted(), quick=True, limit=2, progress=False)
    assert len(with_plan) == len(plain)
    assert (planned.validity.performance["plain_s"] > 0).all()
    pd.testing.assert_frame_equal(planned.validity.metrics, alone.validity.metrics)
    ours, theirs = planned.validity.cached_decoding, alone.validity.cached_decoding
    assert ours.measured == theirs.measured
    if ours.measured:
        assert ours.rows == theirs.rows and abs(ours.total_variation
                                                - theirs.total_variation) <= 1e-6


@pytest.mark.parametrize("make", [_date_bart, _tiny_llama], ids=["date_bart", "tiny_llama"])
def test_the_attribution_cost_counts_the_terms_alti_forms(make):
    """The plan prices ALTI by the number of per-key terms it forms: the cost's count equals
    the query rows x keys x model width of every block the contributions decompose."""
    from attnaudit.auditing.attribution_protocol import Attribution
    from attnaudit.contributions import contributions

    target = make()
    batches, settings, planned = _quick_suite(target)
    batch = batches[0]
    ref = reference(target, batch)
    ctx = BatchContext(target, batch, ref, ref.rows(), settings,
                       frozenset(p.name for p, _ in planned), {}, {}, {})
    cost = Attribution().cost(ctx)
    found = contributions(target, batch, ref.emitted)
    assert found.blocks and len(found.blocks) == len(found.projections)  # every site
    width = target.model.config.hidden_size if hasattr(target.model.config, "hidden_size") \
        else target.model.config.d_model
    formed = 0
    for block in found.blocks.values():
        examples, queries, keys = block.contributions.shape
        keys -= block.role == "cross"  # the decoder stream's column is no per-key term
        formed += examples * queries * keys * width
    assert cost.terms == formed


def test_the_validity_estimate_counts_the_passes_the_plan_does_not_hand_over():
    """Priced from the reference run's timings: per batch the greedy decoding's runs and as
    many teacher-forced passes with capture as without, less the first batch's decoding
    and, when the plan timed one, its pass without capture (a slow pass runs once at the
    quick audit's least, a fast one at least three times and for 0.25 s)."""
    from types import SimpleNamespace

    from attnaudit.auditing.plan import _validity_seconds

    slow = SimpleNamespace(greedy_seconds=2.0, forced_seconds=1.0)
    assert _validity_seconds(slow, 9.0, 3, 1, plain_known=False) == pytest.approx(
        3 * (2.0 + 2 * 1.0) - 2.0)
    assert _validity_seconds(slow, 9.0, 3, 1, plain_known=True) == pytest.approx(
        3 * (2.0 + 2 * 1.0) - 2.0 - 1.0)
    assert _validity_seconds(slow, 9.0, 1, 3, plain_known=True) == pytest.approx(
        3 * 2.0 + 2 * 3 * 1.0 - 2.0 - 1.0)
    fast = SimpleNamespace(greedy_seconds=0.01, forced_seconds=0.02)  # 25 and 13 runs
    assert _validity_seconds(fast, 1.0, 2, 1, plain_known=False) == pytest.approx(
        2 * (25 * 0.01 + 2 * 13 * 0.02) - 0.01)
    untimed = SimpleNamespace(greedy_seconds=None, forced_seconds=None)  # halves of 4 s
    assert _validity_seconds(untimed, 4.0, 1, 1, plain_known=False) == pytest.approx(4.0)
