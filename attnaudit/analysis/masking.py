"""Mass on keys that must not be attended (docs/metrics.md, "Validity").

masked_mass = sum of weights on ineligible keys per row; should be 0. Masking after the
softmax without renormalising, or filling masked scores with 0 instead of -inf, leaks
mass — visible only against a declared eligibility rule (``update(..., eligible=...)``),
since a key mask read off the scores shares the model's mistake.
masked_rows = 1 for a row whose masked mass exceeds ``tolerance`` (its ``sum`` counts them).
"""

from __future__ import annotations

import torch

from attnaudit.analysis.base import Analyser, AttentionRows
from attnaudit.analysis.stats import MetricSpec

DEFAULT_TOLERANCE = 1e-6


class MaskingAnalyser(Analyser):
    metrics = (MetricSpec("masked_mass", 0.0, 1.0), MetricSpec("masked_rows", 0.0, 1.0))

    def __init__(self, tolerance: float = DEFAULT_TOLERANCE, per_example: bool = False) -> None:
        super().__init__(per_example)
        self.tolerance = tolerance

    def rows_metrics(self, rows: AttentionRows
                     ) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
        masked = rows.weights.where(~rows.eligible, 0.0).abs().sum(-1)
        defined = torch.isfinite(masked)
        return {
            "masked_mass": (masked, defined),
            "masked_rows": ((masked > self.tolerance).to(torch.float64), defined),
        }
