"""Value replacement on a seq2seq model whose cross-attention is an ``nn.MultiheadAttention``,
against its forward written out in numpy (float64) from the module's parameters, never
through capture: the query, key and value projections, the source padding, at step t the
value of key j replaced for query row t only — by another example's value at j (the donor
the protocol names), by zero, by the mean of the eligible keys' values — softmax, P V, the
output projection and the output layer."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnaudit.interventions.reference_run import reference
from attnaudit.interventions.values import value_replacement
from attnaudit.targets.contract import Batch
from tests.helpers.toys.mha_seq2seq import BOS, DIM, HEADS, MhaSeq2Seq, mha_target

TOL = 1e-5


class HandWritten:
    """The model's forward in numpy, float64, one (example, step) at a time."""

    def __init__(self, model: MhaSeq2Seq, batch: Batch, emitted: torch.Tensor) -> None:
        p = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
        self.p, self.src, self.valid = p, batch.source_ids.numpy(), batch.source_mask.numpy()
        self.tgt_in = np.concatenate([np.full((len(emitted), 1), BOS),
                                      emitted[:, :-1].numpy()], 1)
        w_q, w_k, w_v = np.split(p["attn.in_proj_weight"], 3)
        b_q, b_k, b_v = np.split(p["attn.in_proj_bias"], 3)
        memory = np.tanh(p["embed.weight"][self.src] @ p["enc.weight"].T + p["enc.bias"])
        self.keys = self._split(memory @ w_k.T + b_k)  # (B, H, n, d)
        self.values = self._split(memory @ w_v.T + b_v)
        self.query = np.tanh(p["tgt_embed.weight"][self.tgt_in])  # (B, T, D)
        self.queries = self._split(self.query @ w_q.T + b_q)  # (B, H, T, d)

    @staticmethod
    def _split(x: np.ndarray) -> np.ndarray:
        b, n, _ = x.shape
        return x.reshape(b, n, HEADS, DIM // HEADS).transpose(0, 2, 1, 3)

    def weights(self, b: int, t: int) -> np.ndarray:
        """(H, n): the step's attention."""
        scores = np.einsum("hd,hnd->hn", self.queries[b, :, t], self.keys[b])
        scores = np.where(self.valid[b], scores / math.sqrt(DIM // HEADS), -np.inf)
        e = np.exp(scores - scores.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    def probs(self, b: int, t: int, values: np.ndarray | None = None) -> np.ndarray:
        """p(. | y_<t, x) at step t; ``values`` (H, n, d) replaces the example's."""
        values = self.values[b] if values is None else values
        read = np.einsum("hn,hnd->hd", self.weights(b, t), values).reshape(-1)
        context = self.p["attn.out_proj.weight"] @ read + self.p["attn.out_proj.bias"]
        logits = self.p["out.weight"] @ np.concatenate([context, self.query[b, t]]) \
            + self.p["out.bias"]
        e = np.exp(logits - logits.max())
        return e / e.sum()

    def tvd(self, b: int, t: int, key: int, control: str, donor: int = -1) -> float:
        values = self.values[b].copy()
        if control == "other_example":
            values[:, key] = self.values[donor, :, key]
        elif control == "zero":
            values[:, key] = 0.0
        else:
            values[:, key] = self.values[b][:, self.valid[b]].mean(1)
        return 0.5 * float(np.abs(self.probs(b, t, values) - self.probs(b, t)).sum())


def test_value_controls_on_multihead_attention_equal_a_hand_written_forward():
    target, model = mha_target()
    batch = next(iter(target.batches()))
    ref = reference(target, batch)
    assert ref.value_sites == ref.sites and set(ref.mechanisms.values()) == {"mha"}
    frame, status = value_replacement(target, ref)
    again, _ = value_replacement(target, ref, chunk_size=1)
    assert (frame["value_other_example_donor"] == again["value_other_example_donor"]).all()
    hand = HandWritten(model, batch, ref.emitted)
    valid = hand.valid
    checked, moved = 0, 0.0
    for row in frame.itertuples():
        b, t = int(row.example), int(row.step)
        w = hand.weights(b, t).mean(0)
        top = int(np.where(valid[b], w, -1.0).argmax())
        for control in ("zero", "mean"):
            assert getattr(row, f"value_{control}_tvd") == pytest.approx(
                hand.tvd(b, t, top, control), abs=TOL)
        donor = int(row.value_other_example_donor)
        if donor < 0:  # no other example of the batch has key `top`
            assert not any(valid[d, top] for d in range(len(valid)) if d != b)
            assert math.isnan(row.value_other_example_tvd)
            continue
        assert donor != b and valid[donor, top]  # length-compatible
        assert row.value_other_example_tvd == pytest.approx(
            hand.tvd(b, t, top, "other_example", donor), abs=TOL)
        random_donor = int(row.value_other_example_random_donor)
        if random_donor >= 0:  # the seeded random key, not re-derived: one key must fit
            assert random_donor != b
            assert any(abs(row.value_other_example_random_tvd
                           - hand.tvd(b, t, k, "other_example", random_donor)) <= TOL
                       for k in np.flatnonzero(valid[b] & valid[random_donor]) if k != top)
        moved = max(moved, row.value_other_example_tvd)
        checked += 1
    assert checked >= 4 and moved > 1e-3
    ran = status.set_index("control")
    assert set(ran["status"]) == {"run"}
    assert ran.loc["other_example", "reason"].startswith("value edit")
