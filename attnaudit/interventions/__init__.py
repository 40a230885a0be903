"""Interventions: edit attention weights or values inside the forward pass and measure what
the output does (attributions live in :mod:`attnaudit.attribution`; the suite that runs
both in :mod:`attnaudit.auditing.intervention_suite`). Each protocol the suite runs is one
:class:`InterventionProtocol` in the registry (:func:`register_protocol`); importing this
package registers the built-in ones (:mod:`attnaudit.interventions.protocols`)."""

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
from attnaudit.interventions.protocol import BatchContext, InterventionProtocol, SuiteSettings
from attnaudit.interventions.protocols import (
    AdversarialSearch,
    CumulativeRemoval,
    Permutation,
    SequenceEffects,
    Uniform,
    ValueReplacement,
    Zeroing,
)
from attnaudit.interventions.reference_run import Reference, RowIndex, reference
from attnaudit.interventions.registry import (
    register_protocol,
    registered_protocols,
    unregister_protocol,
)
from attnaudit.interventions.runner import OutputChange, edited_probs, run_items
from attnaudit.interventions.values import value_replacement

__all__ = [
    "AdversarialSearch",
    "BatchContext",
    "CumulativeRemoval",
    "InterventionError",
    "InterventionProtocol",
    "OutputChange",
    "Permutation",
    "Reference",
    "RowIndex",
    "SequenceEffects",
    "SuiteSettings",
    "Uniform",
    "ValueReplacement",
    "Zeroing",
    "adversarial_search",
    "cumulative_summary",
    "cumulative_test",
    "edited_probs",
    "flip",
    "jsd",
    "permutation_summary",
    "permutation_test",
    "reference",
    "register_protocol",
    "registered_protocols",
    "run_items",
    "tvd",
    "uniform_test",
    "unregister_protocol",
    "value_replacement",
    "weight_gradients",
    "zeroing_flip_table",
    "zeroing_test",
]
