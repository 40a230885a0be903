"""Contributions, not just weights: what each input token contributes to an attention
layer's output.

Norm-based contributions (Kobayashi et al. 2020), ALTI and ALTI+ (Ferrando et al. 2022a/b)
with a per-site exactness check, attention rollout (Abnar & Zuidema 2020), value zeroing
(Mohebbi et al. 2023) and the attention-sink table, for Hugging Face encoder-decoders and
decoder-only models (and any target whose sites expose values and an output projection).
:func:`measure_maps` gives every measure as per-layer source-side maps of one shape.
Definitions: attnaudit/docs/metrics.md.
"""

from attnaudit.contributions.measures import (
    ALL_MEASURES,
    MEASURES,
    Composed,
    Contributions,
    alti_plus,
    contributions,
    measure_maps,
    measure_maps_or_reasons,
    rollout,
)
from attnaudit.contributions.sinks import sink_table

__all__ = ["ALL_MEASURES", "MEASURES", "Composed", "Contributions", "alti_plus",
           "contributions", "measure_maps", "measure_maps_or_reasons", "rollout", "sink_table"]
