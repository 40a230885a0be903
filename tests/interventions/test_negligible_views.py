"""A decoder-only row that puts a negligible share of its weight on the prompt (~1e-44
here, below float32's normal range) is a degenerate row of the interventions (``negligible
view mass``): its prompt view is renormalised exactly, but an edit of it moves nothing.
The toy's attention is biased by construction so that every continuation row after step 0
holds e^-100 of its weight on the prompt, and step 0 (the prompt's last position) holds
all of it."""

from __future__ import annotations

import torch
from torch import nn

from attnaudit.analysis.degenerate import REASONS
from attnaudit.capturing.views import prompt_views
from attnaudit.interventions.reference_run import reference
from attnaudit.targets.contract import Batch, Seq2SeqTarget

V, D, P, T, EOS = 12, 6, 4, 3, 1


class PromptShy(nn.Module):
    """Causal self-attention over prompt + prefix; rows after the prompt's last position
    put e^-100 of their weight on the prompt."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(V, D)
        self.out = nn.Linear(D, V)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)[:, None]  # (B, 1, n, D)
        n = ids.shape[1]
        scores = (x @ x.transpose(-1, -2)) * 1e-3
        scores[..., P:, :P] -= 100.0
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        weights = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1)
        return self.out((weights @ x)[:, 0])


def test_rows_whose_prompt_view_holds_a_negligible_share_are_degenerate():
    model = PromptShy().eval()
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 2]])
    emitted = torch.tensor([[3, 4, 5], [6, 7, 8]])
    batch = Batch(ids, torch.ones_like(ids, dtype=torch.bool), ["a", "b"])

    def teacher_forced(b: Batch, em: torch.Tensor) -> torch.Tensor:
        with prompt_views(P):
            logits = model(torch.cat([b.source_ids, em[:, :-1]], 1))
        return logits[:, P - 1:]

    target = Seq2SeqTarget(
        name="shy", model=model, batches=lambda: [batch], greedy=lambda b: emitted,
        teacher_forced=teacher_forced, source_embedding=model.embed,
        source_tokens=lambda b: [[str(i) for i in r] for r in b.source_ids.tolist()],
        target_tokens=lambda e: [[str(i) for i in r] for r in e.tolist()], eos_id=EOS)
    ref = reference(target, batch)
    assert ref.sites == ("forward:cross",)
    expected = torch.zeros(2, T, dtype=torch.long)
    expected[:, 1:] = REASONS.index("negligible view mass")
    assert torch.equal(ref.reasons, expected)
    # the views themselves are exact distributions over the prompt keys
    torch.testing.assert_close(ref.weights["forward:cross"].sum(-1), torch.ones(2, 1, T))
