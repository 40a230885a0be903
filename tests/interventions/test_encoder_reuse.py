"""Edited re-runs that reuse the encoder state give what full re-runs give."""

import pytest
import torch

from attnaudit.errors import InterventionError
from attnaudit.interventions.permutation import permutation_test
from attnaudit.interventions.reference_run import reference


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_decode_of_encode_is_teacher_forced():
    pytest.importorskip("transformers")
    from attnaudit_examples.date.target import make_target as date_target
    from attnaudit_examples.date_transformer.target import make_target as transformer_target

    for target in (date_target(limit=6), transformer_target()):
        batch = next(target.iter_batches(6))
        with torch.no_grad():
            emitted = target.greedy(batch)
            full = target.teacher_forced(batch, emitted)
            halves = target.decode(batch, target.encode(batch), emitted)
        torch.testing.assert_close(halves, full, rtol=0, atol=1e-5)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("model", ["date", "date_transformer"])
def test_permutation_with_and_without_encoder_reuse(model):
    if model == "date":
        from attnaudit_examples.date.target import make_target
        target = make_target(limit=4)
    else:
        pytest.importorskip("transformers")
        from attnaudit_examples.date_transformer.target import make_target
        target = make_target()
    batch = next(target.iter_batches(4))
    reused = reference(target, batch)
    plain_target = target.with_options(encode=None, decode=None)
    plain = reference(plain_target, batch)
    assert reused.encoded is not None and plain.encoded is None
    a = permutation_test(target, reused, n_permutations=6, progress=False)
    b = permutation_test(plain_target, plain, n_permutations=6, progress=False)
    assert len(a) == len(b) > 0
    for column in ("perm_median_tvd", "perm_median_jsd", "perm_flip_rate"):
        assert (a[column] - b[column]).abs().max() < 1e-5, column


def test_reuse_for_decoder_sites_clear_error_for_encoder_sites():
    pytest.importorskip("transformers")
    from attnaudit_examples.date_transformer.target import make_target

    target = make_target()
    batch = next(target.iter_batches(2))
    ref = reference(target, batch, sites=["model.decoder.layers.1.encoder_attn"])
    assert ref.encoded is not None
    with pytest.raises(InterventionError, match="interventions need one query row"):
        reference(target, batch, sites=["model.encoder.layers.0.self_attn"])
