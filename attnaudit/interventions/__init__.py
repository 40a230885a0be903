"""Interventions: edit attention weights or values inside the forward pass and measure what
the output does (attributions live in :mod:`attnaudit.attribution`; the suite that runs
both in :mod:`attnaudit.auditing.intervention_suite`)."""

from attnaudit.errors import InterventionError
from attnaudit.interventions.ablation import (
    cumulative_summary,
    cumulative_test,
    uniform_test,
    weight_gradients,
    zeroing_flip_table,
    zeroing_test,
)
from attnaudit.interventions.adversarial import adversarial_search
from attnaudit.interventions.outputs import flip, jsd, tvd
from attnaudit.interventions.permutation import permutation_summary, permutation_test
from attnaudit.interventions.reference_run import Reference, RowIndex, reference
from attnaudit.interventions.runner import OutputChange, edited_probs, run_items
from attnaudit.interventions.values import value_replacement

__all__ = [
    "InterventionError",
    "OutputChange",
    "Reference",
    "RowIndex",
    "adversarial_search",
    "cumulative_summary",
    "cumulative_test",
    "edited_probs",
    "flip",
    "jsd",
    "permutation_summary",
    "permutation_test",
    "reference",
    "run_items",
    "tvd",
    "uniform_test",
    "value_replacement",
    "weight_gradients",
    "zeroing_flip_table",
    "zeroing_test",
]
