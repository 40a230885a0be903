"""The two definitions METRICS.md leaves no room on: the median of an even count of values,
and JSD whatever the input dtype — both against numpy / scipy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.special import rel_entr

from attnaudit.interventions.outputs import jsd, median


@pytest.mark.parametrize("count", [1, 2, 3, 4, 100, 101])
def test_median_is_numpys_median(count):
    gen = torch.Generator().manual_seed(count)
    values = torch.rand(6, count, generator=gen)
    values[0] = 0.5  # ties
    np.testing.assert_allclose(median(values).numpy(), np.median(values.numpy(), axis=-1),
                               rtol=0, atol=1e-7)


def test_median_of_an_even_count_is_the_mean_of_the_two_middle_values():
    assert float(median(torch.tensor([0.4, 0.1, 0.3, 0.2]))) == pytest.approx(0.25)


def _with_zeros(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows (5, 8) with exact zeros in p, q or both, in ``dtype``."""
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(2 * torch.randn(5, 8, generator=gen), -1)
    q = torch.softmax(2 * torch.randn(5, 8, generator=gen), -1)
    p[:, :3] = 0.0
    q[:, 2:4] = 0.0
    p[1] = torch.eye(8)[5]  # one-hot rows
    q[2] = torch.eye(8)[0]
    return (p / p.sum(-1, keepdim=True)).to(dtype), (q / q.sum(-1, keepdim=True)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_jsd_with_exact_zeros_matches_scipy_in_every_dtype(dtype):
    p, q = _with_zeros(dtype)
    got = jsd(p, q)
    assert got.dtype == torch.promote_types(dtype, torch.float32)
    # scipy on the same (rounded) numbers in float64, not renormalised: in float16 a row
    # need not sum to exactly 1
    pn, qn = p.double().numpy(), q.double().numpy()
    m = 0.5 * (pn + qn)
    expected = 0.5 * rel_entr(pn, m).sum(-1) + 0.5 * rel_entr(qn, m).sum(-1)
    assert np.isfinite(got.numpy()).all()
    np.testing.assert_allclose(got.double().numpy(), expected, rtol=0, atol=2e-6)
