"""The two things attnaudit takes from Captum's private modules, and why; the only module that
imports one (``tests/attribution/test_captum_internals.py`` checks that).

Captum's public explainers run one target output per call; attnaudit's gradient methods share
one forward pass across the target steps (:mod:`attnaudit.attribution.step_gradients`), so
they cannot call the explainers and instead reproduce two of their choices exactly:

- :func:`integration_points`: the quadrature of ``IntegratedGradients``
  (``captum.attr._utils.approximation_methods.approximation_parameters``), so that
  attnaudit's integrated gradients evaluate the gradient at the same path points with the
  same weights as Captum's, and agree with it to rounding.
- :func:`deeplift_rule_types`: the module types at which ``DeepLift`` applies its
  rescale rule (``captum.attr._core.deep_lift.SUPPORTED_NON_LINEAR``): on a model without
  any, Captum's DeepLift reduces to ``(x - baseline) x`` the gradient at ``x``, which the
  shared forward pass computes at the cost of input x gradient; with them, attnaudit runs
  Captum's public ``DeepLift`` itself.

Both are private names and may move between Captum releases (the project asks for
``captum>=0.7``); a move breaks here, in one place.
"""

from __future__ import annotations

import torch
from captum.attr._core.deep_lift import SUPPORTED_NON_LINEAR
from captum.attr._utils.approximation_methods import approximation_parameters
from torch import nn


def integration_points(method: str, n_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Captum's quadrature ``method`` (e.g. ``"gausslegendre"``, ``"riemann_trapezoid"``) with
    ``n_steps`` points on [0, 1]: (weights (n_steps,), points (n_steps,)) float32; the
    integral of ``f`` over [0, 1] is approximated by ``sum weights * f(points)``."""
    step_sizes, alphas = approximation_parameters(method)
    return (torch.tensor(step_sizes(n_steps), dtype=torch.float32),
            torch.tensor(alphas(n_steps), dtype=torch.float32))


def deeplift_rule_types() -> frozenset[type[nn.Module]]:
    """The module types at which Captum's ``DeepLift`` applies its rules (``nn.ReLU``,
    ``nn.Tanh``, ``nn.Sigmoid``, ``nn.Softmax``, ...); matched by exact type, as Captum
    does."""
    return frozenset(SUPPORTED_NON_LINEAR)
