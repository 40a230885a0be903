"""The plan of an audit before it runs: what each registered protocol will run (edited
items, forward and backward passes) and how long it should take, from a timed first batch.

:func:`plan_audit` runs the first batch's reference run (kept in the plan: the audit's
validity pass takes its timed greedy decoding, and its suite runs its first batch on it) and
the uniform edit on at most :data:`TIMED_ROWS` of its rows, of one cached call where they
can be (timed: seconds per forward pass and per edited item, :func:`_timed_items`), asks
every protocol the suite would run for its
:meth:`~attnaudit.interventions.protocol.InterventionProtocol.cost` on that batch, and
scales it to the data (exact with one batch; an estimate otherwise, and for protocols whose
cost is itself one). The time estimate is passes x the timed seconds per pass (a backward
pass counted as :data:`BACKWARD_FORWARDS` forward ones) plus items x seconds per item; for a
protocol that runs whole edited sequences (faithfulness, attribution: its cost's
``sequences``) it is those sequences x the seconds per sequence of a timed teacher-forced
pass of the first batch (a backward sequence counted as :data:`BACKWARD_FORWARDS`); a
cost's ``terms`` (ALTI's arithmetic) add their number x the seconds per term of a timed
block of random terms of the model's heads and width
(:func:`~attnaudit.contributions.alti.terms_seconds`); a cost's ``gradient_items`` (edited
items run with a backward pass, the adversarial search's) are priced, where no pilot timed
the protocol, from a timed forward and backward pass of a differentiable edit at the
memory budget's gradient chunk (:func:`_timed_gradient_items`). The validity audit's passes are
priced by the reference run's timed greedy decoding and teacher-forced pass
(:func:`_validity_seconds`). With a *pilot* each protocol's
seconds per item are its own: every protocol runs once, in the suite's order, on the first
example of the first batch (row protocols on at most :data:`PILOT_ROWS` of its rows) and is
timed; without one they are the uniform edit's. The pilot runs when the data has at least
:data:`PILOT_MIN_EXAMPLES` examples, for :func:`attnaudit.plan` and ``--dry-run`` as before
an audit (on fewer it would be a large share of the audit itself: on two prompts of a
billion-parameter model, minutes of adversarial search). The progress display replaces the
estimate with each part's measured rate as the audit runs. A protocol without a cost is
listed as "unknown". The same plan feeds the progress display (:func:`expect_plan`),
:func:`attnaudit.plan` and ``--dry-run``. The plan's estimate is of what is left once it is
made: its parts, and the manifest's model hash
(:func:`~attnaudit.report.manifest.hash_seconds`); it states what making it took.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from attnaudit.attribution.options import AttributionOptions
from attnaudit.auditing.intervention_suite import (
    ADVERSARIAL_EXAMPLES,
    CUMULATIVE_EXAMPLES,
    suite_plan,
)
from attnaudit.contributions.alti import terms_seconds
from attnaudit.interventions.ablation import uniform_rows
from attnaudit.interventions.memory import model_heads, model_width_and_layers
from attnaudit.interventions.protocol import (
    BATCH,
    BatchContext,
    Cost,
    InterventionProtocol,
    SuiteSettings,
    subset_rows,
)
from attnaudit.interventions.reference_run import Reference, RowIndex, reference
from attnaudit.interventions.runner import ItemEdit, edited_probs, item_chunks, run_items
from attnaudit.interventions.work_budget import WORK_BUDGET
from attnaudit.options import AuditOptions
from attnaudit.report.manifest import hash_seconds
from attnaudit.runtime.measurement import least_repeats, repeat_count
from attnaudit.runtime.progress import expect
from attnaudit.targets.contract import Batch, Seq2SeqTarget
from attnaudit.targets.kept_decoding import KEPT_LOGITS_BYTES
from attnaudit.targets.placement import execution_device
from attnaudit.validity.timing import PlainPass, plain_pass

VALIDITY = "validity"
TIMED_ITEMS = 64  # edited items of the larger timed uniform edit
TIMED_ROWS = 4  # the first batch's rows the uniform edit is timed on
# A backward pass costs about this many forward passes: no backward pass of the audit takes
# parameter gradients, only the input's or the attention's (one product per forward one;
# 1.13 measured on a 1.24B-parameter model's six-step gradient pass in bfloat16)
BACKWARD_FORWARDS = 1.1
PILOT_ROWS = 4  # rows of the pilot example each row protocol is timed on
PILOT_MIN_EXAMPLES = 16  # an audit's own plan runs the pilot from this many examples on


@dataclass(frozen=True)
class ProtocolPlan:
    """One protocol's part: its cost over the data (None: unknown) and estimated seconds."""

    name: str
    cost: Cost | None
    seconds: float | None


@dataclass(frozen=True)
class Plan:
    """What an audit will run. validity: the validity pass (items: examples; forward: decoder
    steps of the greedy decoding and one teacher-forced pass per batch, an estimate)."""

    target: str
    examples: int
    batches: int
    validity: ProtocolPlan
    protocols: tuple[ProtocolPlan, ...]
    seconds_per_pass: float
    seconds_per_item: float
    piloted: bool = False
    seconds_per_sequence: float = 0.0
    hash_seconds: float = 0.0  # the manifest's model hash (estimated), after the protocols
    planning_seconds: float = 0.0  # what the plan itself took (its reference run, timings)
    work_budget: float = WORK_BUDGET  # multiply-adds per protocol and example (AuditOptions)
    # the first batch's reference run, which the audit's suite takes over (not shown)
    reference: Reference | None = field(default=None, repr=False, compare=False)
    # the first batch's timed pass without capture, which the validity audit takes over
    first_plain: PlainPass | None = field(default=None, repr=False, compare=False)

    @property
    def seconds(self) -> float:
        """The estimate of what is left once the plan is made: its parts and the hash."""
        parts = (self.validity, *self.protocols)
        return sum(p.seconds for p in parts if p.seconds is not None) + self.hash_seconds

    def __str__(self) -> str:
        lines = [f"plan of audit {self.target}: {self.examples} examples in {self.batches} "
                 f"batches; timed on the first batch: {self.seconds_per_pass * 1e3:.3g} ms "
                 f"per forward pass + "
                 + ("each protocol's time per item from a pilot run on one example"
                    if self.piloted else
                    f"{self.seconds_per_item * 1e3:.3g} ms per edited item (no pilot run)")
                 + (f"; {self.seconds_per_sequence * 1e3:.3g} ms per teacher-forced "
                    "sequence (the protocols that run whole edited sequences)"
                    if self.seconds_per_sequence else "")
                 + f"; planned in {_duration(self.planning_seconds)}",
                 f"  {'part':<18} {'items':>10} {'forward':>9} {'backward':>9} {'estimate':>10}"]
        for p in (self.validity, *self.protocols):
            if p.cost is None:
                lines.append(f"  {p.name:<18} {'unknown':>10} {'unknown':>9} {'unknown':>9} "
                             f"{'unknown':>10}")
                continue
            mark = "" if p.cost.exact else "~"
            lines.append(f"  {p.name:<18} {mark + str(p.cost.items):>10} "
                         f"{mark + str(p.cost.forward):>9} {mark + str(p.cost.backward):>9} "
                         f"{_duration(p.seconds):>10}")
        if self.hash_seconds:
            lines.append(f"  {'model hash':<18} {'':>10} {'':>9} {'':>9} "
                         f"{_duration(self.hash_seconds):>10}")
        budgeted = [note for p in self.protocols if p.cost is not None for note in p.cost.notes]
        if budgeted:
            lines.append(f"  the work budget ({self.work_budget:.0e} multiply-adds per protocol "
                         "and example) runs less of:")
            lines += [f"    {note}" for note in budgeted]
        unknown = [p.name for p in self.protocols if p.cost is None]
        lines.append(f"  estimate {_duration(self.seconds)} in all"
                     + (f", besides {', '.join(unknown)} (cost unknown)" if unknown else "")
                     + " (~: an estimate or a bound)")
        return "\n".join(lines)


def plan_audit(target: Seq2SeqTarget, options: AuditOptions,
               attribution: AttributionOptions | None = None, *,
               pilot: bool | None = None) -> Plan:
    """The plan of ``audit(target, options=options)`` (its suite unless ``checks_only`` or
    not ``interventions``; ``attribution``: the suite's attribution options), at the cost of
    the first batch's reference run and uniform edit, and of the pilot (module docstring;
    None: when the data has at least :data:`PILOT_MIN_EXAMPLES` examples)."""
    edits = options.edits
    batches, settings, _, _, planned = suite_plan(
        target, quick=options.quick, limit=options.limit, progress=False,
        n_permutations=None, cumulative_examples=CUMULATIVE_EXAMPLES,
        adversarial_examples=ADVERSARIAL_EXAMPLES, attribution=attribution,
        sequence_effects=edits.sequence_effects, work_budget=options.work_budget)
    first = batches[0]
    started = time.perf_counter()
    ref = reference(target, first, sites=edits.sites, heads=edits.heads, first_example=0,
                    max_memory=options.max_memory)
    ref_seconds = time.perf_counter() - started
    decoding = int(ref.emitted.shape[1]) + 1  # greedy steps and one teacher-forced pass
    counted = ref.rows()
    timed = counted.select(_timed_rows(ref, counted))
    pass_s, item_s = _timed_items(target, ref, timed, ref_seconds / decoding)
    first_plain: PlainPass | None = None  # timed when a protocol runs whole sequences
    terms_s: float | None = None  # timed when a protocol's contribution arithmetic runs
    gradient: tuple[float, float] | None = None  # timed when a protocol takes gradients
    scale, single = settings.n_examples / len(first), len(batches) == 1
    protocols = []
    suite = options.interventions and not options.checks_only
    if pilot is None:
        pilot = settings.n_examples >= PILOT_MIN_EXAMPLES
    rates = _pilot_rates(target, first, options, planned, settings, pass_s) \
        if suite and pilot else {}
    for protocol, examples in (planned if suite else []):
        rows, factor = counted, scale
        if examples is not None:
            rows = subset_rows(ref, counted, examples) if single else counted
            factor = 1.0 if single else len(examples) / len(first)
        if protocol.scope != BATCH and not len(rows):
            protocols.append(ProtocolPlan(protocol.name, Cost(0, 0), 0.0))
            continue
        cost = protocol.cost(BatchContext(target, first, ref, rows, settings,
                                          frozenset(p.name for p, _ in planned), {}, {}, {}))
        if cost is None:
            protocols.append(ProtocolPlan(protocol.name, None, None))
            continue
        cost = cost.scaled(factor, single)
        if cost.sequences:
            if first_plain is None:
                first_plain = _timed_sequence(target, first, ref.emitted)
            seconds = ((cost.sequences + BACKWARD_FORWARDS * cost.backward_sequences)
                       * _per_sequence(first_plain, first))
        elif cost.gradient_items and protocol.name not in rates:  # a pilot timed it whole
            if gradient is None:
                longest = int(ref.emitted.shape[1]) - 1
                gradient = _timed_gradient_items(target, ref, timed, ref.budget.sequences(
                    ref.positions(longest), grad=True))
            grad_pass_s, grad_item_s = gradient
            plain = cost.forward - cost.backward  # passes without a backward pass
            seconds = (plain * pass_s + cost.backward * grad_pass_s
                       + (cost.items - cost.gradient_items) * item_s
                       + cost.gradient_items * grad_item_s)
        else:
            seconds = _passes(cost) * pass_s + cost.items * rates.get(protocol.name, item_s)
        if cost.terms:
            if terms_s is None:
                terms_s = terms_seconds(model_heads(target.model),
                                        model_width_and_layers(target.model)[0],
                                        int(first.source_ids.shape[1]),
                                        execution_device(target.model))
            seconds += cost.terms * terms_s
        protocols.append(ProtocolPlan(protocol.name, cost, seconds))
    validity = ProtocolPlan(VALIDITY, Cost(settings.n_examples, round(decoding * len(batches)),
                                           exact=False),
                            _validity_seconds(ref, ref_seconds, len(batches),
                                              least_repeats(options.quick),
                                              plain_known=first_plain is not None))
    hashed = 0.0 if options.checks_only else hash_seconds(target.model)  # as the audit hashes
    return Plan(target.name, settings.n_examples, len(batches), validity, tuple(protocols),
                pass_s, item_s, piloted=bool(rates),
                seconds_per_sequence=_per_sequence(first_plain, first),
                hash_seconds=hashed, planning_seconds=time.perf_counter() - started,
                work_budget=options.work_budget,
                reference=ref, first_plain=first_plain)


def _validity_seconds(ref: Reference, ref_seconds: float, batches: int, least: int, *,
                      plain_known: bool) -> float:
    """The validity audit's estimate: the reference run's greedy decoding and teacher-forced
    pass with capture priced by their timings (``ref_seconds`` halved where it has none), each
    repeated as :func:`~attnaudit.runtime.measurement.repeat_count` asks (at least
    ``least``), with as many teacher-forced passes without capture, on every batch, less
    what the plan hands the audit on the first batch (the reference run's decoding and,
    ``plain_known``, the timed pass without capture). The comparison of the cached decoding
    is not priced (a kept decoding's logits cost nothing more)."""
    greedy = ref.greedy_seconds if ref.greedy_seconds is not None else ref_seconds / 2
    forced = ref.forced_seconds if ref.forced_seconds is not None else ref_seconds / 2
    per_batch = repeat_count(greedy, least) * greedy + 2 * repeat_count(forced, least) * forced
    return max(per_batch * batches - greedy - forced * plain_known, 0.0)


def _passes(cost: Cost) -> float:
    """Forward passes, a backward one counted as :data:`BACKWARD_FORWARDS`."""
    return cost.forward + BACKWARD_FORWARDS * cost.backward


def _pilot_rates(target: Seq2SeqTarget, first: Batch, options: AuditOptions,
                 planned: Sequence[tuple[InterventionProtocol, set[int] | None]],
                 settings: SuiteSettings, pass_s: float) -> dict[str, float]:
    """Protocol -> seconds per item beyond its passes (``pass_s`` each), from one timed run
    of every planned protocol, in order, on the first example of the batch ``first`` (row
    protocols on at most :data:`PILOT_ROWS` of its counted rows); a protocol whose pilot ran
    no item is left out (it keeps the uniform edit's rate), and one that runs whole
    sequences is not run (the timed teacher-forced pass prices it)."""
    edits = options.edits
    batch = first.select(torch.arange(1))
    ref = reference(target, batch, sites=edits.sites, heads=edits.heads, first_example=0,
                    max_memory=options.max_memory)
    counted = ref.rows()
    rows = counted.select(torch.arange(min(PILOT_ROWS, len(counted))))
    running = frozenset(p.name for p, _ in planned)
    earlier: dict[str, dict[str, pd.DataFrame]] = {}
    shared: dict[str, Any] = {}
    rates = {}
    for protocol, _ in planned:
        if protocol.scope != BATCH and not len(rows):
            continue
        ctx = BatchContext(target, batch, ref, counted if protocol.scope == BATCH else rows,
                           settings, running, earlier, shared, {})
        cost = protocol.cost(ctx)
        if cost is not None and cost.sequences:
            continue
        started = time.perf_counter()
        earlier[protocol.name] = protocol.run(ctx)
        seconds = time.perf_counter() - started
        if cost is not None and cost.items:
            rates[protocol.name] = max(seconds - _passes(cost) * pass_s, 0.0) / cost.items
    return rates


def _timed_sequence(target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor) -> PlainPass:
    """One timed teacher-forced pass over ``batch`` without capture (warm: the reference run
    has just run the model), with its logits while they fit
    :data:`~attnaudit.targets.kept_decoding.KEPT_LOGITS_BYTES`: the validity audit's first
    pass without capture on that batch."""
    timed = plain_pass(target, batch, emitted, keep_logits=True)
    logits = timed.logits
    if logits is not None and logits.numel() * logits.element_size() > KEPT_LOGITS_BYTES:
        timed = PlainPass(timed.seconds, timed.peak_mib)
    return timed


def _per_sequence(timed: PlainPass | None, batch: Batch) -> float:
    """Seconds per example-sequence of the timed pass over ``batch`` (0: none ran)."""
    return 0.0 if timed is None else timed.seconds / max(len(batch), 1)


def _timed_rows(ref: Reference, rows: RowIndex) -> torch.Tensor:
    """(at most :data:`TIMED_ROWS`,) long: the rows the uniform edit is timed on, from the
    call group (:meth:`~attnaudit.interventions.reference_run.Reference.call_group`) most
    rows share first, so that the timed runs take as few calls as the items allow."""
    group = ref.call_group(rows.step)
    if not len(group):
        return torch.zeros(0, dtype=torch.long)
    values, counts = torch.unique(group, return_counts=True)
    others = (group != values[counts.argmax()]).long()
    return torch.argsort(others, stable=True)[:TIMED_ROWS]


def _timed_items(target: Seq2SeqTarget, ref: Reference, rows: RowIndex, fallback: float
                 ) -> tuple[float, float]:
    """Seconds per forward pass and per edited item, from the uniform edit of ``rows`` run
    with one copy per row and then with enough copies for about :data:`TIMED_ITEMS` items
    (more items per pass: a cached call's cost per item grows with its rows once reading the
    weights no longer hides it, so the slope is taken up to the size of the chunks the
    protocols run; the larger run also pays for the memory its pass takes first, as theirs
    do); ``fallback`` per pass and nothing per item without rows."""
    if not len(rows):
        return fallback, 0.0
    eligible = ref.eligible[rows.example, rows.step]
    times: dict[int, float] = {}
    many = max(2, -(-TIMED_ITEMS // len(rows)))
    for copies in (1, many):
        started = time.perf_counter()
        run_items(target, ref, rows.example.repeat_interleave(copies),
                  rows.step.repeat_interleave(copies),
                  ItemEdit(uniform_rows, eligible.repeat_interleave(copies, 0)))
        times[copies] = time.perf_counter() - started
    passes = sum(1 for _ in item_chunks(ref, rows.step))
    extra = passes != sum(1 for _ in item_chunks(ref, rows.step.repeat_interleave(many)))
    if extra:  # more items took more passes: spread the time over the items alone
        return 0.0, times[many] / (many * len(rows))
    fixed, item_s = _line(times, many, len(rows))
    return fixed / passes, item_s


def _line(times: dict[int, float], many: int, rows: int) -> tuple[float, float]:
    """The seconds ``times`` of ``rows`` items run with 1 and with ``many`` copies each, as
    a fixed part and seconds per item (the slope between the two, neither below 0)."""
    item_s = max(times[many] - times[1], 0.0) / ((many - 1) * rows)
    return max(times[1] - item_s * rows, 0.0), item_s


def _timed_gradient_items(target: Seq2SeqTarget, ref: Reference, rows: RowIndex,
                          per_pass: int) -> tuple[float, float]:
    """Seconds per forward and backward pass and per edited item of one, from a
    differentiable edit (each row's weights times a leaf scale, gradients to the scale, as
    the adversarial search takes them to its candidates) of ``rows`` run with one copy per
    row and then with about ``per_pass`` items (the memory budget's gradient chunk, at most
    :data:`TIMED_ITEMS`), as :func:`_timed_items` times the uniform edit; nothing without
    rows."""
    if not len(rows):
        return 0.0, 0.0
    times: dict[int, float] = {}
    many = max(2, -(-min(per_pass, TIMED_ITEMS) // len(rows)))
    for copies in (1, many):
        example = rows.example.repeat_interleave(copies)
        step = rows.step.repeat_interleave(copies)
        scale = torch.ones(len(example), 1, 1, requires_grad=True)

        def edit(site: str, old: torch.Tensor, ids: torch.Tensor,
                 scale: torch.Tensor = scale) -> torch.Tensor:
            return old * scale[ids].to(old.dtype)

        started = time.perf_counter()
        with torch.enable_grad():
            probs = edited_probs(target, ref, example, step, edit, torch.arange(len(example)))
            torch.autograd.grad(probs.max(-1).values.sum(), [scale])
        times[copies] = time.perf_counter() - started
    return _line(times, many, len(rows))


def expect_plan(plan: Plan, *, suite_only: bool = False) -> None:
    """Declare the plan's parts to the open progress display (their units and estimated
    seconds per unit); ``suite_only``: the protocols alone (no validity pass runs)."""
    for p in (*(() if suite_only else (plan.validity,)), *plan.protocols):
        if p.cost is not None:
            estimate = p.seconds / p.cost.items if p.cost.items and p.seconds else None
            unit = "examples" if p.name == VALIDITY else "items"
            expect(p.name, p.cost.items, estimate, unit)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}:{rest:02d}" if minutes else f"{seconds:.1f} s"
