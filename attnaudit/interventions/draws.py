"""Random draws for one row that do not depend on how far its batch was padded.

A row's generator (``runner.row_generator``) is seeded per (example, step); drawing one
value per key of the padded width would still make the draws depend on the batch the
example landed in. Drawing one value per *eligible* key, in key order, does not.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def eligible_draws(sample: Callable[..., torch.Tensor], generator: torch.Generator,
                   lead: tuple[int, ...], eligible: torch.Tensor) -> torch.Tensor:
    """Draws (*lead, n) for a row whose eligible keys are ``eligible`` (n,) bool.

    ``sample`` (``torch.rand`` or ``torch.randn``) draws (*lead, n_valid) from ``generator``;
    they fill the eligible keys in order and every other key gets 0.
    """
    out = torch.zeros(*lead, eligible.shape[-1])
    out[..., eligible] = sample(*lead, int(eligible.sum()), generator=generator)
    return out
