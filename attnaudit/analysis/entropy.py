"""Shape of each attention row over its eligible keys (docs/metrics.md, "Shape of the
distribution").

entropy H = -sum w ln(w + 1e-10) over eligible keys (nats); entropy_norm = H / ln(n_valid),
defined for n_valid >= 2; effective_keys = exp(H); kl_to_uniform = ln(n_valid) - H;
max_weight = largest eligible weight. Rows with no eligible key, or with non-finite
weights, have no distribution: they are left out here and counted by the numerics analyser.
A row with a negative eligible weight is no distribution either: it keeps its max_weight
and n_valid but has no entropy, entropy_norm, effective_keys or kl_to_uniform (the
numerics analyser counts its negative weights).
"""

from __future__ import annotations

import math

import torch

from attnaudit.analysis.base import Analyser, AttentionRows
from attnaudit.analysis.stats import MetricSpec

EPS = 1e-10


class EntropyAnalyser(Analyser):
    metrics = (
        MetricSpec("entropy", 0.0, 8.0),
        MetricSpec("entropy_norm", 0.0, 1.0),
        MetricSpec("effective_keys", 1.0, 129.0),
        MetricSpec("kl_to_uniform", 0.0, 8.0),
        MetricSpec("max_weight", 0.0, 1.0),
        MetricSpec("n_valid", 0.0, 512.0),
    )

    def rows_metrics(self, rows: AttentionRows
                     ) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
        w = rows.eligible_weights
        n_valid = rows.n_valid.to(torch.float64)
        defined = rows.finite & (n_valid >= 1)
        distribution = defined & (w >= 0).all(-1)  # ineligible keys are 0 in w
        entropy = -(w * torch.log(w.clamp_min(0.0) + EPS)).sum(-1)
        log_n = torch.log(n_valid.clamp_min(1.0))
        return {
            "entropy": (entropy, distribution),
            "entropy_norm": (entropy / log_n.clamp_min(math.log(2)),
                             distribution & (n_valid >= 2)),
            "effective_keys": (torch.exp(entropy), distribution),
            "kl_to_uniform": (log_n - entropy, distribution),
            "max_weight": (rows.weights.masked_fill(~rows.eligible, float("-inf")).amax(-1),
                           defined),
            "n_valid": (n_valid, None),
        }
