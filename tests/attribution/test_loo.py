"""Input leave-one-out against replacements run one at a time and TVD computed with numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from attnaudit.attribution.loo import leave_one_out
from attnaudit.errors import InterventionError
from attnaudit.targets.contract import Batch, Seq2SeqTarget
from tests.helpers.fingerprints import assert_unchanged, model_fingerprint

PAD, BOS, EOS, UNK, VOCAB = 0, 1, 2, 3, 8
IGNORED = 2  # the source position the toy model never reads


class FirstTwoTokens(nn.Module):
    """Logits at step t depend on the source tokens at positions 0 and 1 and on the previous
    target token, never on position 2 or later."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, 4)
        self.tgt_embed = nn.Embedding(VOCAB, 4)
        self.out = nn.Linear(4, VOCAB)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        read = self.embed(src)[:, :IGNORED].sum(1, keepdim=True)  # (B, 1, d)
        return self.out(torch.tanh(read + self.tgt_embed(tgt_in)))


def toy_target() -> tuple[Seq2SeqTarget, Batch, torch.Tensor]:
    model = FirstTwoTokens()
    src = torch.tensor([[4, 5, 6, 7], [7, 6, 4, PAD], [5, 4, 5, 6]])
    batch = Batch(src, src != PAD, ["a", "b", "c"])
    emitted = torch.tensor([[4, 5, EOS], [6, EOS, PAD], [7, 7, 4]])

    def teacher_forced(b: Batch, em: torch.Tensor) -> torch.Tensor:
        tgt_in = torch.cat([torch.full_like(em[:, :1], BOS), em[:, :-1]], 1)
        return model(b.source_ids, tgt_in)

    target = Seq2SeqTarget(
        name="toy", model=model, batches=lambda: [batch], greedy=lambda b: emitted,
        teacher_forced=teacher_forced, source_embedding=model.embed,
        source_tokens=lambda b: [], target_tokens=lambda e: [], eos_id=EOS,
        special_ids=(PAD, 7))  # token 7 is "special": never left out
    return target, batch, emitted


def reference_loo(target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor,
                  token: int) -> np.ndarray:
    """One forward per replaced token; TVD in numpy; zero outside eligible keys and steps."""
    with torch.no_grad():
        p = torch.softmax(target.teacher_forced(batch, emitted), -1).double().numpy()
        out = np.zeros(batch.source_ids.shape[:1] + emitted.shape[1:] + batch.source_ids.shape[1:])
        keys = target.explain_keys(batch)
        steps = target.step_mask(emitted).numpy()
        for b, j in keys.nonzero().tolist():
            one = batch.select([b])
            one.source_ids[0, j] = token
            q = torch.softmax(target.teacher_forced(one, emitted[b : b + 1]), -1)
            out[b, :, j] = 0.5 * np.abs(p[b] - q[0].double().numpy()).sum(-1) * steps[b]
    return out


@pytest.mark.parametrize(("replace_with", "token", "chunk_size"),
                         [("pad", PAD, 4096), (UNK, UNK, 2)])
def test_matches_one_replacement_at_a_time(replace_with: str | int, token: int,
                                           chunk_size: int) -> None:
    target, batch, emitted = toy_target()
    before = model_fingerprint(target.model)
    loo = leave_one_out(target, batch, emitted, replace_with, chunk_size=chunk_size)
    assert_unchanged(target.model, before)
    expected = reference_loo(target, batch, emitted, token)
    np.testing.assert_allclose(loo.numpy(), expected, atol=1e-6)
    assert loo[:, :, :IGNORED].gt(0).any()  # the reference is not all zeros


def test_a_token_the_output_ignores_gets_zero() -> None:
    target, batch, emitted = toy_target()
    loo = leave_one_out(target, batch, emitted)
    assert target.explain_keys(batch)[:, IGNORED].all()
    assert loo[:, :, IGNORED].eq(0).all()
    assert loo[:, :, 3].eq(0).all()  # padding, special token 7, or ignored position
    assert loo[0, :, 0].gt(0).all() and loo[1, 2:].eq(0).all()  # after </s>: zero


def test_reference_probabilities_are_reused() -> None:
    target, batch, emitted = toy_target()
    with torch.no_grad():
        probs = torch.softmax(target.teacher_forced(batch, emitted), -1)
    shifted = probs.roll(1, dims=-1)
    assert not torch.equal(leave_one_out(target, batch, emitted, reference_probs=shifted),
                           leave_one_out(target, batch, emitted))


def test_bad_inputs_give_clear_errors() -> None:
    target, batch, emitted = toy_target()
    with pytest.raises(ValueError, match='"pad" or a token id'):
        leave_one_out(target, batch, emitted, "mask")
    with pytest.raises(ValueError, match="outside the source vocabulary"):
        leave_one_out(target, batch, emitted, VOCAB)
    with pytest.raises(TypeError, match="int token id"):
        leave_one_out(target, batch, emitted, 1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="emitted must be long"):
        leave_one_out(target, batch, emitted[0])
    with pytest.raises(InterventionError, match="reference_probs"):
        leave_one_out(target, batch, emitted, reference_probs=torch.ones(3, 2, VOCAB))


def test_date_model_matches_one_replacement_at_a_time() -> None:
    from attnaudit_examples.date.target import make_target

    target = make_target(limit=2)
    batch = next(target.iter_batches())
    emitted = target.greedy(batch)
    before = model_fingerprint(target.model)
    loo = leave_one_out(target, batch, emitted, chunk_size=7)
    assert_unchanged(target.model, before)
    np.testing.assert_allclose(loo.numpy(), reference_loo(target, batch, emitted, PAD),
                               atol=1e-5)
    assert loo[batch.source_mask[:, None, :].expand_as(loo)].gt(0).mean(dtype=float) > 0.5
