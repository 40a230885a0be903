"""The audit's work budget: how much of the costliest protocols' work an audit runs on a model
where all of it would cost more than a budget of multiply-adds per example
(docs/metrics.md, "The work budget").

Integrated gradients' points, the adversarial search's steps, leave-one-out's edits, value
zeroing's re-runs and the faithfulness curves' edited sources are sized on the date models by
what their papers define; on a billion-parameter model the same sizes cost hundreds of times the
model's own work. Each of those protocols prices one unit of its work in multiply-adds
(parameters x tokens run; a backward pass as one forward) and runs all of it when it fits
``work_budget`` per example, else as many units as the budget buys, never fewer than the
protocol's stated least (or, for the adversarial search and value zeroing, none at all). The
budget is in multiply-adds, not seconds, so the same model and data give the same audit on any
machine; the plan prints what each budget left out
(:attr:`~attnaudit.interventions.protocol.Cost.notes`) and the metadata says what ran.
"""

from __future__ import annotations

import math

# Multiply-adds each budgeted protocol may spend per example it runs on (about 16 teacher-
# forced sequences of 102 tokens on a 1.24B-parameter model; nothing binds on the date
# models)
WORK_BUDGET = 2e12


def budget_record(budget: float) -> float | str:
    """``budget`` as the metadata and the manifest record it: the number, or ``"none"``."""
    return "none" if math.isinf(budget) else budget


def affordable(wanted: int, each: float, least: int, budget: float) -> int:
    """How many of ``wanted`` units of work, ``each`` multiply-adds apiece, run under
    ``budget`` multiply-adds: all of them when they fit, else as many as it buys, and never
    fewer than ``least`` (nor more than ``wanted``)."""
    if math.isinf(budget) or wanted * each <= budget:
        return wanted
    return min(wanted, max(least, int(budget // max(each, 1.0))))
