"""Captum's private modules are touched in one place, and what that place gives is what its
docstring says: Gauss-Legendre points on [0, 1] and the module types of DeepLift's rules."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from attnaudit.attribution.captum_internals import deeplift_rule_types, integration_points
from attnaudit.attribution.reference_methods import rule_modules

PACKAGE = Path(__file__).resolve().parents[2] / "attnaudit"
INTERNALS = PACKAGE / "attribution" / "captum_internals.py"


def private_captum_imports(source: str) -> list[str]:
    """The private Captum modules (a dotted part starting with ``_``) that ``source`` imports,
    at the top, inside functions or under ``if TYPE_CHECKING:``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found += [n for n in names if n.split(".")[0] == "captum"
                  and any(part.startswith("_") for part in n.split(".")[1:])]
    return found


def test_only_captum_internals_imports_a_private_captum_module() -> None:
    offenders = {str(p.relative_to(PACKAGE.parent)): private_captum_imports(p.read_text())
                 for p in sorted(PACKAGE.rglob("*.py")) if p != INTERNALS}
    assert {p: found for p, found in offenders.items() if found} == {}
    assert len(private_captum_imports(INTERNALS.read_text())) == 2


def test_the_check_finds_planted_private_imports() -> None:
    planted = ("import captum.attr._core.deep_lift\n"
               "from captum.attr import _utils\n"
               "from typing import TYPE_CHECKING\n"
               "if TYPE_CHECKING:\n"
               "    from captum._utils.common import _format_tensor_into_tuples\n"
               "def f():\n    from captum.attr._core import deep_lift\n"
               "from captum.attr import DeepLift\nimport captum\n")
    assert private_captum_imports(planted) == [
        "captum.attr._core.deep_lift", "captum.attr._utils",
        "captum._utils.common._format_tensor_into_tuples", "captum.attr._core.deep_lift"]


@pytest.mark.parametrize("n_steps", [1, 3, 8, 50])
def test_gauss_legendre_points_are_numpys_rescaled_to_the_unit_interval(n_steps: int) -> None:
    weights, points = integration_points("gausslegendre", n_steps)
    nodes, node_weights = np.polynomial.legendre.leggauss(n_steps)
    assert weights.dtype == points.dtype == torch.float32
    np.testing.assert_allclose(points.numpy(), (nodes + 1) / 2, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(weights.numpy(), node_weights / 2, rtol=1e-6, atol=1e-7)
    # exact for polynomials of degree 2n - 1 on [0, 1]: the integral of x^k is 1 / (k + 1)
    degree = 2 * n_steps - 1
    assert float((weights.double() * points.double() ** degree).sum()) == pytest.approx(
        1 / (degree + 1), rel=1e-5)


def test_deeplift_rule_types_are_the_nonlinearity_modules_and_match_by_exact_type() -> None:
    types = deeplift_rule_types()
    assert {nn.ReLU, nn.Tanh, nn.Sigmoid, nn.Softmax} <= types
    assert not {nn.GELU, nn.Linear, nn.LSTM} & types

    class OwnReLU(nn.ReLU):
        pass

    model = nn.Sequential(nn.Linear(2, 2), nn.Tanh(), nn.GELU(), OwnReLU(), nn.ReLU(), nn.Tanh())
    assert rule_modules(model) == ("ReLU", "Tanh")
