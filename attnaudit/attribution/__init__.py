"""Attribution: gradient methods through Captum (and the exact per-step ones), leave-one-out,
and the agreement of every importance measure with the attention weights."""

from attnaudit.attribution.agreement import (
    JAIN_WALLACE_REFERENCE,
    agreement,
    beside_reference,
    summarise_agreement,
)
from attnaudit.attribution.loo import leave_one_out
from attnaudit.attribution.methods import attribute
from attnaudit.attribution.options import AttributionOptions, Attributions

__all__ = [
    "JAIN_WALLACE_REFERENCE",
    "AttributionOptions",
    "Attributions",
    "agreement",
    "attribute",
    "beside_reference",
    "leave_one_out",
    "summarise_agreement",
]
