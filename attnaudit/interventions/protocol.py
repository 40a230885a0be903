"""One protocol of the intervention suite as one class (docs/interventions.md, "Adding a
protocol").

A protocol is an :class:`InterventionProtocol` registered with
:func:`~attnaudit.interventions.registry.register_protocol`. The suite
(:func:`attnaudit.auditing.intervention_suite.run_suite`), its progress plan, its metadata,
the checklist and the protocol contract test read every protocol from the registry; none
of them names one. Per batch the suite hands each running protocol a :class:`BatchContext`
and keeps the tables its :meth:`~InterventionProtocol.run` returns: columns returned under
:data:`ROWS` join the per-row table ``rows`` on :data:`ROW_KEYS`, every other name is a
table of its own (its CSV name), concatenated over batches in batch order.

Which rows a protocol sees is its degenerate-row handling (:attr:`~InterventionProtocol.scope`):
:data:`EVERY_ROW` and :data:`SUBSET` protocols get only counted rows (degenerate rows are
listed in the ``degenerate`` table and never handed to them), :data:`BATCH` protocols the
whole batch. A protocol that needs another's results on the batch (a faithfulness test
reading attribution maps) names it in :attr:`~InterventionProtocol.after` and reads
``ctx.earlier`` or ``ctx.shared``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import torch

from attnaudit.analysis.bootstrap import bootstrap_interval
from attnaudit.interventions.reference_run import Reference, RowIndex
from attnaudit.interventions.work_budget import WORK_BUDGET, affordable
from attnaudit.targets.contract import Batch, Seq2SeqTarget

QUICK, FULL = "quick", "full"  # the suite's modes (``run_suite(quick=...)``)
BOTH_MODES = frozenset({QUICK, FULL})
# What rows a protocol runs on (its degenerate-row handling, module docstring).
EVERY_ROW = "every counted row"
SUBSET = "the counted rows of seeded examples"
BATCH = "the whole batch"
ROWS = "rows"  # the per-row table: EVERY_ROW protocols' columns joined on ROW_KEYS
ROW_KEYS = ["example", "step", "n_valid", "max_attention"]
# table -> the columns a protocol writes into it (ROWS: besides ROW_KEYS)
Columns = Mapping[str, tuple[str, ...]]
# One row of the ``summary`` table: metric, value, n (rows counted), variant, and, where the
# number has one, its bootstrap interval over examples (value_low, value_high; NaN without).
SummaryRow = tuple[str, float, int, str] | tuple[str, float, int, str, float, float]
# One checklist sentence and the misconception key it speaks to ("" for none).
ChecklistLine = tuple[str, str]


@dataclass(frozen=True)
class SuiteSettings:
    """What the suite was asked to run (``run_suite``'s arguments, resolved).

    attribution: the suite's ``attnaudit.attribution.options.AttributionOptions`` (typed
    loosely: attribution is a layer above this one); methods: the attribution methods run.
    gold: None, or one ``attnaudit.alignments.pharaoh.Alignment`` per example of the data
    (``audit(gold=FILE)``), read in place of the target's ``gold_alignments``.
    work_budget: the multiply-adds each budgeted protocol may spend per example
    (:mod:`attnaudit.interventions.work_budget`; ``math.inf``: no budget).
    """

    quick: bool
    n_examples: int
    seed: int
    n_permutations: int
    cumulative_examples: int
    adversarial_examples: int
    sequence_effects: bool = False
    progress: bool = False
    attribution: Any = None
    methods: tuple[str, ...] = ()
    gold: Any = None  # a gold file's alignments per example (alignments: a layer above)
    work_budget: float = WORK_BUDGET

    @property
    def mode(self) -> str:
        return QUICK if self.quick else FULL


@dataclass(frozen=True)
class Cost:
    """What a protocol runs on one batch (:meth:`InterventionProtocol.cost`).

    items: the edited copies it runs (the units of its progress counters); forward,
    backward: the model's forward and backward passes (a chunk of items is one pass);
    exact: False when the counts are an estimate (a test that stops early, such as the
    cumulative removal, runs at most ``items``); sequences, backward_sequences: for a
    protocol that runs whole teacher-forced passes (an edited source, not one cached step),
    how many example-sequences its forward and backward passes hold in all (a share of one
    for a copy run from a cached prefix), the unit the plan times with one teacher-forced
    pass (0: its passes are cached steps); terms: the
    numbers of per-key contribution terms its ALTI arithmetic forms (examples x query rows
    x keys x model width over every site), which the plan prices by a timed block of them;
    gradient_items: of ``items``, those run with a backward pass through their one cached
    step (gradients to the edit), which the plan prices by a timed gradient pass; notes:
    what the work budget left out, one phrase each, which the plan prints.
    """

    items: int
    forward: int
    backward: int = 0
    exact: bool = True
    sequences: float = 0.0
    backward_sequences: float = 0.0
    terms: int = 0
    notes: tuple[str, ...] = ()
    gradient_items: int = 0

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.items + other.items, self.forward + other.forward,
                    self.backward + other.backward, self.exact and other.exact,
                    self.sequences + other.sequences,
                    self.backward_sequences + other.backward_sequences,
                    self.terms + other.terms,
                    self.notes + other.notes,
                    self.gradient_items + other.gradient_items)

    def scaled(self, factor: float, exact: bool) -> Cost:
        """Every count times ``factor`` (rounded, but for the sequences); ``exact`` and'ed
        with this one's."""
        return Cost(round(self.items * factor), round(self.forward * factor),
                    round(self.backward * factor), self.exact and exact,
                    self.sequences * factor, self.backward_sequences * factor,
                    round(self.terms * factor), self.notes,
                    round(self.gradient_items * factor))


@dataclass
class BatchContext:
    """What a protocol's :meth:`~InterventionProtocol.run` gets for one batch.

    rows: the rows it runs on (its :attr:`~InterventionProtocol.scope`; all counted rows of
    the batch for a BATCH protocol); running: the names of every protocol the suite runs;
    earlier: the tables of the protocols run before it on this batch, by protocol name;
    shared: values a protocol leaves for later ones on this batch (the attribution protocol
    leaves ``importances``: name -> (B, T, n) maps); facts: the protocol's own notes for
    :meth:`~InterventionProtocol.metadata`, the same dict on every batch of the suite.
    """

    target: Seq2SeqTarget
    batch: Batch
    ref: Reference
    rows: RowIndex
    settings: SuiteSettings
    running: frozenset[str] = frozenset()
    earlier: Mapping[str, Mapping[str, pd.DataFrame]] | None = None
    shared: dict[str, Any] | None = None
    facts: dict[str, Any] | None = None

    def parameters(self) -> int:
        """The model's parameters (a tied tensor once): the multiply-adds of one token."""
        return sum(p.numel() for p in self.target.model.parameters())

    def sequence_multiply_adds(self) -> float:
        """What one edited sequence of the batch costs the model, roughly: its parameters x
        the tokens of a sequence (the source or prompt and the emitted steps)."""
        return float(self.parameters()) * (int(self.batch.source_ids.shape[1])
                                           + int(self.ref.emitted.shape[1]))

    def affordable(self, wanted: int, each: float, least: int) -> int:
        """How many of ``wanted`` units of a protocol's work, ``each`` multiply-adds per
        example, the settings' work budget buys
        (:func:`~attnaudit.interventions.work_budget.affordable`)."""
        return affordable(wanted, each, least, self.settings.work_budget)


class InterventionProtocol(ABC):
    """One protocol: what it runs, its tables, summary, checklist lines and metadata.

    Subclasses set :attr:`name` and :attr:`columns` and implement :meth:`run`; the other
    methods default to nothing. Instances hold no state between runs (the registry keeps
    one); a protocol's own settings are attributes.
    """

    name: ClassVar[str]
    columns: ClassVar[Columns]  # what every run writes, at least
    scope: ClassVar[str] = EVERY_ROW
    modes: ClassVar[frozenset[str]] = BOTH_MODES
    # the protocols whose results on the batch it reads (run before it)
    after: ClassVar[tuple[str, ...]] = ()
    # the tables of per-(example, step) rows, which hold counted rows only
    row_tables: ClassVar[tuple[str, ...]] = (ROWS,)

    def enabled(self, settings: SuiteSettings) -> bool:
        """Whether the suite runs it with ``settings`` (default: in its :attr:`modes`)."""
        return settings.mode in self.modes

    def examples(self, settings: SuiteSettings) -> set[int] | None:
        """A SUBSET protocol's global example indices (an empty set: it does not run);
        None for every example."""
        return None

    def progress_items(self, counted_rows: int) -> int:
        """Progress counters it opens on a batch with ``counted_rows`` rows (each moves the
        display on by an equal share of the batch, :func:`attnaudit.runtime.progress.split`)."""
        return 1 if counted_rows or self.scope == BATCH else 0

    def cost(self, ctx: BatchContext) -> Cost | None:
        """What :meth:`run` will run on ``ctx``'s batch, computed before it runs (the suite's
        plan and its progress display, :mod:`attnaudit.auditing.plan`); None: not known
        (the plan says "unknown" for it)."""
        return None

    @abstractmethod
    def run(self, ctx: BatchContext) -> dict[str, pd.DataFrame]:
        """Its tables for one batch, by name (:data:`ROWS`: per-row columns, ROW_KEYS
        included), with global example indices."""

    def assemble(self, parts: Mapping[str, pd.DataFrame], tables: Mapping[str, pd.DataFrame]
                 ) -> dict[str, pd.DataFrame]:
        """Its final tables from ``parts`` (its own tables over every batch, ROWS excluded)
        and ``tables`` (the suite's so far, ``rows`` complete). Default: ``parts``."""
        return dict(parts)

    def summary(self, tables: Mapping[str, pd.DataFrame]) -> list[SummaryRow]:
        """Its rows of the ``summary`` table."""
        return []

    def checklist_lines(self, tables: Mapping[str, pd.DataFrame]) -> list[ChecklistLine]:
        """Its sentences on the checklist's intervention item, from the suite's tables by
        name (nothing when its tables are absent)."""
        return []

    def metadata(self, settings: SuiteSettings, examples: set[int] | None,
                 facts: Mapping[str, Any]) -> dict[str, object]:
        """Its entries of the suite's metadata (asked also when it did not run);
        examples: :meth:`examples`; facts: what its batches left in ``ctx.facts`` (one
        dict from batch to batch; over the ranks integer counts are summed, sets joined)."""
        return {}


def seeded_examples(n_examples: int, count: int, seed: int) -> set[int]:
    """``count`` global example indices out of ``n_examples``, drawn with ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    return set(torch.randperm(n_examples, generator=gen)[:count].tolist())


def subset_rows(ref: Reference, rows: RowIndex, chosen: set[int]) -> RowIndex:
    """The ``rows`` of ``ref``'s batch whose global example index is in ``chosen``."""
    keep = torch.tensor([ref.first_example + int(e) in chosen for e in rows.example],
                        dtype=torch.bool)
    return rows.select(keep.nonzero().squeeze(1))


def table_with(tables: Mapping[str, pd.DataFrame], name: str, column: str
               ) -> pd.DataFrame | None:
    """Table ``name`` when it has rows and ``column`` (a protocol's own column: a quick
    suite may lack it), else None."""
    table = tables.get(name)
    return table if table is not None and len(table) and column in table.columns else None


def rate(series: pd.Series) -> float:
    """The mean of a flag column read as numbers (NaN rows left out)."""
    return float(pd.to_numeric(series, errors="coerce").astype(float).mean())


def example_mean(rows: pd.DataFrame, column: str) -> float:
    """Mean over steps within each example, then over examples (docs/metrics.md)."""
    return float(rows.dropna(subset=[column]).groupby("example")[column].mean().mean())


def interval_row(metric: str, values: Any, examples: Any, variant: str, *,
                 statistic: Callable[[np.ndarray], float] | None = None,
                 rows: int | None = None) -> SummaryRow:
    """A summary row whose value carries its bootstrap interval over examples
    (:func:`attnaudit.analysis.bootstrap.bootstrap_interval`; ``values`` one per row,
    ``examples`` their example ids or None for one example a value); rows: the n to report
    (default: the finite values)."""
    found = bootstrap_interval(np.asarray(values, dtype=np.float64),
                               None if examples is None else np.asarray(examples),
                               statistic=statistic)
    return (metric, found.estimate, found.rows if rows is None else rows, variant,
            found.low, found.high)


def tvd_and_flip(rows: pd.DataFrame, prefix: str) -> list[SummaryRow]:
    """``{prefix}_tvd`` (example mean) and ``{prefix}_flip`` (rate) over the rows that have
    them, with their intervals over examples."""
    part = rows.dropna(subset=[f"{prefix}_tvd"])
    means = part.groupby("example")[f"{prefix}_tvd"].mean()  # one number per example
    return [interval_row(f"{prefix}_tvd", means.to_numpy(), None,
                         "mean over steps, then over examples", rows=len(part)),
            interval_row(f"{prefix}_flip", part[f"{prefix}_flip"].astype(bool), part["example"],
                         "token flip rate")]
