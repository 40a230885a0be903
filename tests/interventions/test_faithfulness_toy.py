"""Faithfulness on a model whose output depends on exactly one known source key: the
removal curves, AOPC and normalised AOPC equal their analytic values for the right ranking,
the reversed ranking and the seeded random floor (attnaudit.interventions.faithfulness,
docs/metrics.md "Faithfulness of the importance measures").

With the output a function of key J alone and Delta = p(full) - p(J replaced by pad):
comprehensiveness at a bin of k keys is Delta when J is among the k removed, else 0;
sufficiency is 0 when J is among the k kept, else Delta. A ranking placing J at rank r
(0-based) has AOPC_comp = Delta * mean_f [r < k_f] and AOPC_suff = Delta * mean_f [r >= k_f].
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from attnaudit.auditing.faithfulness_protocol import RANDOM
from attnaudit.interventions.faithfulness import (
    FRACTIONS,
    aopc,
    bin_sizes,
    normalised,
    random_ranking,
    removal_curves,
    row_seed,
)
from attnaudit.interventions.reference_run import reference
from attnaudit.targets.contract import Batch, Seq2SeqTarget
from tests.interventions.test_protocol_contract import contract_protocols, run_alone

PAD, BOS, EOS = 0, 1, 2
VOCAB, DIM, STEPS, KEY = 9, 5, 3, 1  # KEY: the one source position the output reads
SOURCES = ([3, 4, 5, 6], [7, 3, 8, 4, 5, 6, 3], [5, 8, 6], [6, 4, 7, 3, 8, 5, 4, 3, 6, 7, 8])


class OneKeySeq2Seq(nn.Module):
    """Cross-attention over the source is computed (capture sees it) but the logits at
    every step read only source position KEY's embedding and the decoder input."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.src_embed = nn.Embedding(VOCAB, DIM)
        self.tgt_embed = nn.Embedding(VOCAB, DIM)
        self.out = nn.Linear(DIM, VOCAB)
        self.eval()

    def attend(self, queries: torch.Tensor, keys: torch.Tensor, src: torch.Tensor
               ) -> torch.Tensor:
        scores = (queries @ keys.transpose(1, 2)).masked_fill((src == PAD)[:, None], -torch.inf)
        return torch.softmax(scores, dim=-1) @ keys

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        queries, keys = self.tgt_embed(tgt_in), self.src_embed(src)
        context = self.attend(queries, keys, src)
        return self.out(3 * keys[:, KEY : KEY + 1] + queries + 0.0 * context)

    @torch.no_grad()
    def greedy(self, src: torch.Tensor) -> torch.Tensor:
        tgt_in = torch.full((src.shape[0], 1), BOS)
        for _ in range(STEPS):
            tgt_in = torch.cat([tgt_in, self(src, tgt_in)[:, -1].argmax(-1)[:, None]], 1)
        return tgt_in[:, 1:]


def one_key_target() -> Seq2SeqTarget:
    model = OneKeySeq2Seq()

    def batches():
        width = max(len(s) for s in SOURCES)
        ids = torch.tensor([s + [PAD] * (width - len(s)) for s in SOURCES])
        yield Batch(ids, ids != PAD, [" ".join(map(str, s)) for s in SOURCES])

    def teacher_forced(batch: Batch, emitted: torch.Tensor) -> torch.Tensor:
        start = torch.full_like(emitted[:, :1], BOS)
        return model(batch.source_ids, torch.cat([start, emitted[:, :-1]], dim=1))

    def tokens(ids: torch.Tensor) -> list[list[str]]:
        return [[f"t{i}" for i in row.tolist()] for row in ids]

    return Seq2SeqTarget(name="one_key", model=model, batches=batches,
                         greedy=lambda batch: model.greedy(batch.source_ids),
                         teacher_forced=teacher_forced, source_embedding=model.src_embed,
                         source_tokens=lambda b: tokens(b.source_ids), target_tokens=tokens,
                         eos_id=EOS, special_ids=(PAD,), kinds={"attend": "cross"},
                         description="output reads one key")


@pytest.fixture(scope="module")
def setup():
    target = one_key_target()
    ref = reference(target, next(target.iter_batches()))
    rows = ref.rows()
    emitted = ref.emitted
    # Delta by a direct forward pass with KEY replaced by the pad token
    removed = ref.batch.source_ids.clone()
    removed[:, KEY] = PAD
    with torch.no_grad():
        start = torch.full_like(emitted[:, :1], BOS)
        logits = target.model(removed, torch.cat([start, emitted[:, :-1]], 1)).double()
    p_removed = torch.softmax(logits, -1).gather(-1, emitted[..., None]).squeeze(-1)
    p_full = ref.probs.double().gather(-1, emitted[..., None]).squeeze(-1)
    delta = (p_full - p_removed)[rows.example, rows.step].numpy()
    n = ref.eligible[rows.example, rows.step].sum(-1).numpy()
    assert delta.min() > 1e-2  # removing the key lowers the audited token's probability
    return target, ref, rows, delta, n


def rank_orders(ref, rows, n_keys):
    """Right (KEY first, then the others in position order) and reversed rankings."""
    right, reverse = [], []
    for e, s in zip(rows.example.tolist(), rows.step.tolist(), strict=True):
        keys = ref.eligible[e, s].nonzero().squeeze(1).tolist()
        others = [k for k in keys if k != KEY]
        tail = [k for k in range(n_keys) if k not in keys]
        right.append([KEY, *others, *tail])
        reverse.append([*others[::-1], KEY, *tail])
    return torch.tensor(right), torch.tensor(reverse)


def expected(delta: float, n: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """Comprehensiveness and sufficiency curves (F,) with KEY at ``rank`` of n."""
    removed = np.array([rank < k for k in bin_sizes(n)], dtype=float)
    return delta * removed, delta * (1 - removed)


def test_bins_round_up_and_hold_at_least_one_key():
    assert bin_sizes(4) == [1, 1, 1, 1, 2]
    assert bin_sizes(11) == [1, 1, 2, 3, 6]
    assert bin_sizes(200) == [2, 10, 20, 40, 100]
    assert bin_sizes(1) == [1] * len(FRACTIONS)


def test_right_reversed_and_random_rankings_give_the_analytic_curves_and_aopc(setup):
    target, ref, rows, delta, n = setup
    right, reverse = rank_orders(ref, rows, ref.batch.source_ids.shape[1])
    eligible = ref.eligible[rows.example, rows.step]
    seeds = [row_seed(7, e, s) for e, s in zip(rows.example.tolist(), rows.step.tolist(),
                                                 strict=True)]
    rand = random_ranking(eligible, seeds)
    orders = torch.stack([right, reverse, rand], 1)
    curves = removal_curves(target, ref, rows, orders, PAD, chunk_size=5)
    comp, suff = aopc(curves.comprehensiveness), aopc(curves.sufficiency)
    ncomp, nsuff = normalised(comp, True).numpy(), normalised(suff, False).numpy()
    for i in range(len(rows)):
        r_random = rand[i].tolist().index(KEY)
        for o, rank in enumerate((0, int(n[i]) - 1, r_random)):
            c, s = expected(delta[i], int(n[i]), rank)
            np.testing.assert_allclose(curves.comprehensiveness[i, o].numpy(), c, atol=1e-6)
            np.testing.assert_allclose(curves.sufficiency[i, o].numpy(), s, atol=1e-6)
            assert comp[i, o].item() == pytest.approx(c.mean(), abs=1e-6)
            assert suff[i, o].item() == pytest.approx(s.mean(), abs=1e-6)
        # bounds over the three orderings: the analytic AOPCs of ranks 0, n-1 (KEY in no
        # bin: 50 % of n >= 2 keys is fewer than n) and the random rank
        share = np.mean([r_random < k for k in bin_sizes(int(n[i]))])
        analytic = delta[i] * np.array([1.0, 0.0, share])  # AOPC_comp; AOPC_suff = delta - it
        want = (analytic - analytic.min()) / (analytic.max() - analytic.min())
        np.testing.assert_allclose(ncomp[i], want, atol=1e-5)
        np.testing.assert_allclose(nsuff[i], want, atol=1e-5)


def test_the_random_floor_has_the_expected_aopc_over_seeds():
    """Over seeds, KEY's rank is uniform on 0..n-1, so E[AOPC_comp] / Delta is exactly
    mean_f k_f / n (enumerating the n ranks); the seeded draws' mean is within 4 standard
    errors of it."""
    n, draws = 7, 4000
    eligible = torch.ones(draws, n, dtype=torch.bool)
    ranks = (random_ranking(eligible, [row_seed(0, e, 0) for e in range(draws)])
             == KEY).long().argmax(-1).numpy()
    sizes = bin_sizes(n)
    exact = np.mean([np.mean([r < k for k in sizes]) for r in range(n)])
    assert exact == pytest.approx(np.mean(sizes) / n)
    values = np.array([np.mean([r < k for k in sizes]) for r in ranks])
    assert abs(values.mean() - exact) < 4 * values.std() / math.sqrt(draws)


def test_normalised_aopc_is_undefined_when_every_ordering_scores_the_same():
    values = torch.tensor([[0.2, 0.2, 0.2], [0.1, 0.3, 0.2]], dtype=torch.float64)
    assert torch.isnan(normalised(values, True)[0]).all()
    np.testing.assert_allclose(normalised(values, True)[1].numpy(), [0.0, 1.0, 0.5])
    np.testing.assert_allclose(normalised(values, False)[1].numpy(), [1.0, 0.0, 0.5])


def test_the_protocol_ranks_by_leave_one_out_as_the_analytic_best_ordering(setup):
    target, ref, rows, delta, n = setup
    tables = run_alone(contract_protocols()["faithfulness"], target, ref)
    table = tables["faithfulness_rows"].set_index(["example", "step", "measure"])
    for i, (e, s) in enumerate(zip(rows.example.tolist(), rows.step.tolist(), strict=True)):
        loo = table.loc[(e, s, "leave_one_out")]  # only KEY moves the output: rank 0
        c, su = expected(delta[i], int(n[i]), 0)
        assert loo["aopc_comprehensiveness"] == pytest.approx(c.mean(), abs=1e-6)
        assert loo["aopc_sufficiency"] == pytest.approx(su.mean(), abs=1e-6)
        # every ordering's AOPC lies between rank 0's and rank n-1's, and the bound ordering
        # (reversed leave-one-out) puts KEY last: the bounds are {0, delta}
        assert loo["normalised_aopc_comprehensiveness"] == pytest.approx(1.0, abs=1e-5)
        assert loo["normalised_aopc_sufficiency"] == pytest.approx(1.0, abs=1e-5)
        assert loo["aopc_comprehensiveness_bound_low"] == pytest.approx(0.0, abs=1e-6)
        assert loo["aopc_sufficiency_bound_high"] == pytest.approx(delta[i], abs=1e-6)
        rand = table.loc[(e, s, RANDOM)]
        order = random_ranking(ref.eligible[e, s][None], [row_seed(target.seed, e, s)])[0]
        rank = order.tolist().index(KEY)
        c, su = expected(delta[i], int(n[i]), rank)
        got = [rand[f"comprehensiveness_{f}"] for f in FRACTIONS]
        np.testing.assert_allclose(got, c, atol=1e-6)
        share = np.mean([rank < k for k in bin_sizes(int(n[i]))])
        assert rand["normalised_aopc_comprehensiveness"] == pytest.approx(share, abs=1e-5)
        assert rand["normalised_aopc_sufficiency"] == pytest.approx(share, abs=1e-5)
    summary = contract_protocols()["faithfulness"].assemble(tables, {})["faithfulness_summary"]
    assert set(summary["measure"]) >= {"weights", "leave_one_out", RANDOM}
