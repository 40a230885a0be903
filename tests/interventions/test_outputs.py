import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon

from attnaudit.interventions.outputs import flip, jsd, tvd


def _random_dists(seed: int, shape=(7, 5)) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    p = torch.softmax(3 * torch.randn(shape, generator=gen), -1).double()
    q = torch.softmax(3 * torch.randn(shape, generator=gen), -1).double()
    return p, q


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tvd_jsd_flip_match_independent_references(seed):
    p, q = _random_dists(seed)
    pn, qn = p.numpy(), q.numpy()
    np.testing.assert_allclose(tvd(p, q).numpy(), 0.5 * np.abs(pn - qn).sum(-1), atol=1e-12)
    ref_jsd = np.array([jensenshannon(a, b) ** 2 for a, b in zip(pn, qn, strict=True)])
    np.testing.assert_allclose(jsd(p, q).numpy(), ref_jsd, atol=1e-8)
    np.testing.assert_array_equal(flip(p, q).numpy(), pn.argmax(-1) != qn.argmax(-1))


def test_bounds_and_identity():
    p, _ = _random_dists(3)
    assert torch.all(tvd(p, p) == 0) and torch.all(jsd(p, p).abs() < 1e-9)
    one_hot_a, one_hot_b = torch.eye(2).double()[0], torch.eye(2).double()[1]
    assert float(tvd(one_hot_a, one_hot_b)) == 1.0
    assert abs(float(jsd(one_hot_a, one_hot_b)) - np.log(2)) < 1e-6
    assert not flip(p, p).any()


def test_shape_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match="differ in shape"):
        tvd(torch.ones(2, 3), torch.ones(3, 3))
