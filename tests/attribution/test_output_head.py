"""The output projection's row-sparse backward pass: the same gradients as autograd's dense
one, on a hand-built projection and through the date BART's own output head, and the model
restored afterwards."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnaudit.attribution.output_head import RowSparseLinear, sparse_output_head


@pytest.mark.parametrize("bias", [True, False])
def test_row_sparse_backward_equals_the_dense_one(bias: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 8, generator=gen, requires_grad=True)
    weight = torch.randn(50, 8, generator=gen)
    b = torch.randn(50, generator=gen) if bias else None
    grad = torch.randn(3, 5, 50, generator=gen)
    grad[:, [0, 2, 3]] = 0  # the rows a step's backward pass does not reach
    grad[1, 4] = 0
    sparse = RowSparseLinear.apply(x, weight, b)
    torch.testing.assert_close(sparse, F.linear(x, weight, b), rtol=1e-6, atol=1e-6)
    (got,) = torch.autograd.grad(sparse, x, grad)
    (dense,) = torch.autograd.grad(F.linear(x, weight, b), x, grad)
    torch.testing.assert_close(got, dense, rtol=1e-6, atol=1e-6)
    assert got[:, [0, 2, 3]].abs().max() == 0


def test_a_strided_slice_of_the_last_positions_gives_the_dense_values_and_gradients(
        ) -> None:
    """The slice a model that keeps only the last positions' logits hands its head
    (non-contiguous, requiring grad, against a constant weight)."""
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(2, 9, 8, generator=gen, requires_grad=True)
    weight = torch.randn(40, 8, generator=gen)
    x = hidden[:, -3:]
    assert not x.is_contiguous()
    sparse = RowSparseLinear.apply(x, weight, None)
    assert sparse.shape == (2, 3, 40)
    torch.testing.assert_close(sparse, F.linear(x, weight), rtol=1e-6, atol=1e-6)
    grad = torch.randn(2, 3, 40, generator=gen)
    (got,) = torch.autograd.grad(sparse, hidden, grad)
    (dense,) = torch.autograd.grad(F.linear(x, weight), hidden, grad)
    torch.testing.assert_close(got, dense, rtol=1e-6, atol=1e-6)
    assert got[:, :-3].abs().max() == 0


def test_the_date_bart_head_runs_sparse_and_is_restored() -> None:
    pytest.importorskip("transformers")
    from attnaudit_examples.date_transformer.target import make_target

    target = make_target()
    head = target.model.get_output_embeddings()
    batch = next(target.iter_batches(limit=4))
    emitted = target.greedy(batch)
    embedded = target.source_embedding(batch.source_ids).detach().requires_grad_()

    def step_gradients() -> list[torch.Tensor]:
        calls = []

        def hook(_m: nn.Module, _a: object, out: torch.Tensor) -> torch.Tensor | None:
            calls.append(1)
            return embedded if len(calls) == 1 else None

        handle = target.source_embedding.register_forward_hook(hook)
        try:
            probs = torch.softmax(target.teacher_forced(batch, emitted).float(), -1)
        finally:
            handle.remove()
        picked = probs.gather(-1, emitted[..., None]).squeeze(-1)
        return [torch.autograd.grad(picked[:, t].sum(), embedded, retain_graph=True)[0]
                for t in range(emitted.shape[1])]

    dense = step_gradients()
    with sparse_output_head(target.model):
        assert "forward" in vars(head)
        sparse = step_gradients()
    assert "forward" not in vars(head)
    for t, (a, b) in enumerate(zip(sparse, dense, strict=True)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7, msg=f"step {t}")
    assert max(float(g.abs().max()) for g in dense) > 1e-4


class _PackedLinear(nn.Linear):
    """A subclass that may store its weight otherwise (as quantized linears do)."""


class _Model(nn.Module):
    def __init__(self, head: nn.Module | None) -> None:
        super().__init__()
        self.head = head

    def get_output_embeddings(self) -> nn.Module:
        if self.head is None:
            raise NotImplementedError
        return self.head


@pytest.mark.parametrize("head", [_PackedLinear(2, 2), None])
def test_a_model_without_a_plain_linear_head_runs_unchanged(head: nn.Module | None) -> None:
    with sparse_output_head(_Model(head)):
        assert head is None or "forward" not in vars(head)
    plain = nn.Linear(2, 2)  # the contrast: a plain head is patched, then restored
    with sparse_output_head(_Model(plain)):
        assert "forward" in vars(plain)
    assert "forward" not in vars(plain)
