import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon

from attnaudit.interventions.outputs import changes, flip, jsd, tvd


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


@pytest.mark.parametrize(("rows", "dtype"), [(17, torch.float32), (21, torch.float32),
                                             (1, torch.float32), (5, torch.float16),
                                             (9, torch.float64)])
def test_changes_are_tvd_jsd_flip_over_a_large_vocabulary(rows, dtype):
    """All three at once, in row blocks on the CPU (17 rows: a last block of one row is
    folded into the one before), against numpy and equal to the separate functions."""
    gen = torch.Generator().manual_seed(rows)
    logits = 4 * torch.randn(2, rows, 60_000, generator=gen, dtype=torch.float64)
    logits[0, 0, :1000] = -torch.inf  # exact zeros: smoothed before the log
    p, q = torch.softmax(logits, -1).to(dtype)
    change, divergence, flipped = changes(p, q)
    pn, qn = p.double().numpy(), q.double().numpy()
    atol = 1e-3 if dtype == torch.float16 else 1e-5  # float16 rounds 60,000 small terms
    np.testing.assert_allclose(change.double().numpy(), 0.5 * np.abs(pn - qn).sum(-1),
                               atol=atol)
    ref_jsd = np.array([jensenshannon(a, b) ** 2 for a, b in zip(pn, qn, strict=True)])
    np.testing.assert_allclose(divergence.double().numpy(), ref_jsd, atol=10 * atol)
    np.testing.assert_array_equal(flipped.numpy(), pn.argmax(-1) != qn.argmax(-1))
    for got, expected in zip((change, divergence, flipped), (tvd(p, q), jsd(p, q), flip(p, q)),
                             strict=True):
        assert got.dtype == expected.dtype and torch.equal(got, expected)


def test_changes_keep_leading_axes():
    p, q = _random_dists(4, shape=(2, 3, 5))
    for got, expected in zip(changes(p, q), (tvd(p, q), jsd(p, q), flip(p, q)), strict=True):
        assert got.shape == (2, 3) and torch.equal(got, expected)
