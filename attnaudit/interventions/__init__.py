"""Interventions: edit attention inside the forward pass and measure what the output does."""

from attnaudit.interventions.ablation import (
    cumulative_summary,
    cumulative_test,
    uniform_test,
    weight_gradients,
    zeroing_flip_table,
    zeroing_test,
)
from attnaudit.interventions.adversarial import adversarial_search
from attnaudit.interventions.agreement import (
    JAIN_WALLACE_REFERENCE,
    agreement,
    beside_reference,
    summarise_agreement,
)
from attnaudit.interventions.attribution import AttributionOptions, Attributions, attribute
from attnaudit.interventions.loo import leave_one_out
from attnaudit.interventions.outputs import flip, jsd, tvd
from attnaudit.interventions.permutation import permutation_summary, permutation_test
from attnaudit.interventions.runner import (
    InterventionError,
    OutputChange,
    Reference,
    Rows,
    edited_probs,
    reference,
    run_items,
)
from attnaudit.interventions.suite import InterventionSuite, run_suite
from attnaudit.interventions.values import value_replacement

__all__ = [
    "JAIN_WALLACE_REFERENCE",
    "AttributionOptions",
    "Attributions",
    "InterventionError",
    "InterventionSuite",
    "OutputChange",
    "Reference",
    "Rows",
    "adversarial_search",
    "agreement",
    "attribute",
    "beside_reference",
    "cumulative_summary",
    "cumulative_test",
    "edited_probs",
    "flip",
    "jsd",
    "leave_one_out",
    "permutation_summary",
    "permutation_test",
    "reference",
    "run_items",
    "run_suite",
    "summarise_agreement",
    "tvd",
    "uniform_test",
    "value_replacement",
    "weight_gradients",
    "zeroing_flip_table",
    "zeroing_test",
]
