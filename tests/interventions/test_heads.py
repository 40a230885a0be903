"""Interventions on chosen heads of a chosen layer, against a hand-written edit."""

import pytest
import torch

import attnaudit
from attnaudit.errors import InterventionError
from attnaudit.interventions.ablation import uniform_test
from attnaudit.interventions.reference_run import reference

SITE = "model.decoder.layers.1.encoder_attn:cross"
HEAD = 2


@pytest.fixture(scope="module")
def bart_target():
    pytest.importorskip("transformers")
    from attnaudit_examples.date_transformer.target import make_target

    return make_target()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_uniform_on_one_head_matches_hand_written_edit(bart_target):
    batch = next(bart_target.iter_batches(2))
    ref = reference(bart_target, batch, sites=[SITE], heads=[HEAD])
    assert ref.heads == {SITE: 1} and ref.head_index == (HEAD,)
    got = uniform_test(bart_target, ref)
    assert got["uniform_tvd"].max() > 1e-3  # the edit does move the output
    model = bart_target.model
    explain = bart_target.explain_keys(batch)
    for row in got.sample(6, random_state=0).itertuples():
        b, t = int(row.example), int(row.step)
        src = batch.select([b])
        emitted = ref.emitted[b : b + 1, : t + 1]
        keys = explain[b]

        def edit(site, weights, key_mask, t=t, keys=keys):
            new = weights.clone()
            line = new[0, HEAD, t]
            line[:] = 0.0  # Wiegreffe & Pinter: 1 / n_valid on eligible keys, 0 on the rest
            line[keys] = 1.0 / keys.sum()
            return new

        with torch.no_grad():
            before = torch.softmax(bart_target.teacher_forced(src, emitted)[0, t], -1)
            with attnaudit.capture(model, sites=[SITE], edit=edit):
                after = torch.softmax(bart_target.teacher_forced(src, emitted)[0, t], -1)
        expected = 0.5 * (before - after).abs().sum().item()
        assert row.uniform_tvd == pytest.approx(expected, abs=1e-5)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_bad_head_index_is_a_clear_error(bart_target):
    batch = next(bart_target.iter_batches(1))
    with pytest.raises(InterventionError, match="4 head"):
        reference(bart_target, batch, sites=[SITE], heads=[4])


class TwoHeadPointer(torch.nn.Module):
    """Two heads whose scores are masked per head (the key mask has a head axis): the
    context of each head is ``weights @ embedded source``; logits read both contexts."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(6, 4)
        self.query = torch.nn.Parameter(torch.randn(2, 4))
        self.out = torch.nn.Linear(8, 5)

    def attend(self, memory: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        scores = torch.einsum("hd,bnd->bhn", self.query, memory)[:, :, None, :]
        weights = torch.softmax(scores.masked_fill(~valid[:, None, None, :], float("-inf")), -1)
        return self.read(weights, memory)

    def read(self, weights: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        return self.out(torch.einsum("bhqn,bnd->bhqd", weights, memory).flatten(1))

    def forward(self, src: torch.Tensor, steps: int) -> torch.Tensor:
        memory = self.embed(src)
        return torch.stack([self.attend(memory, src != 0) + t for t in range(steps)], 1)


def test_one_head_with_a_per_head_key_mask():
    from attnaudit.targets.contract import Batch, Seq2SeqTarget

    model = TwoHeadPointer().eval()
    src = torch.tensor([[1, 2, 3, 0], [4, 5, 1, 2]])
    batch = Batch(src, src != 0, ["a", "b"])
    target = Seq2SeqTarget(
        name="two heads", model=model, batches=lambda: [batch],
        greedy=lambda b: model(b.source_ids, 2).argmax(-1),
        teacher_forced=lambda b, emitted: model(b.source_ids, emitted.shape[1]),
        source_embedding=model.embed, source_tokens=lambda b: [], target_tokens=lambda e: [],
        eos_id=99, special_ids=(0,), kinds={"attend": "cross"})
    ref = reference(target, batch, heads=[1])
    assert ref.eligible.equal((src != 0)[:, None, :].expand(-1, 2, -1))
    got = uniform_test(target, ref)
    with torch.no_grad():  # independent: head 1 uniform over real keys, head 0 as the model has it
        memory, valid = model.embed(src), src != 0
        scores = torch.einsum("hd,bnd->bhn", model.query, memory)
        weights = torch.softmax(scores.masked_fill(~valid[:, None, :], float("-inf")), -1)
        before = torch.softmax(model.read(weights[:, :, None], memory), -1)
        weights[:, 1] = valid / valid.sum(-1, keepdim=True)
        after = torch.softmax(model.read(weights[:, :, None], memory), -1)
    expected = 0.5 * (before - after).abs().sum(-1)  # the same at every step
    for row in got.itertuples():
        assert row.uniform_tvd == pytest.approx(float(expected[row.example]), abs=1e-6)
    assert got["uniform_tvd"].min() > 1e-3
