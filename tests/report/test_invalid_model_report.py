"""On a model that fails validity the report claims no unit row sums and no explanation.

The model is the committed trained date model with its mask applied after the softmax
(``softmax(scores) * valid``, not renormalised): the weights capture sees put mass on
padding, and the weights the model uses do not sum to one. A second target, the toy whose
tapped weights are normalised over the query axis, fails the row-sum check itself; there
the note must count the rows numpy finds off by more than the tolerance.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import attnaudit
from attnaudit.checklist import FAIL
from attnaudit.checklist.items import NOT_SUPPORTED
from attnaudit.targets.loading import load_target
from attnaudit_examples.date.model import DateAttentionModel
from attnaudit_examples.date.target import make_target as date_target

SUM_TO_ONE = "counted rows sums to one"
TOYS = Path(__file__).parents[1] / "helpers" / "toys" / "masking.py"
TOY_WRONG_AXIS = f"{TOYS}:wrong_axis_tapped"


class MaskAfterSoftmax(DateAttentionModel):
    """The trained date model with its mask applied after the softmax (a planted bug)."""

    def attend(self, query: torch.Tensor, memory: torch.Tensor, keys: torch.Tensor,
               valid: torch.Tensor) -> torch.Tensor:
        feats = torch.tanh(keys + self.query_proj(query)[:, None, :])
        weights = torch.softmax(self.score_vec(feats).squeeze(-1), dim=-1) * valid
        return torch.bmm(weights[:, None, :], memory).squeeze(1)


@pytest.fixture(scope="module")
def leaky_date_audit():
    target = date_target(limit=12, batch_size=12)
    target.model.__class__ = MaskAfterSoftmax  # the same trained parameters
    return attnaudit.audit(target, quick=True, progress=False)


def _evidence(audit: attnaudit.Audit, claim_start: str) -> str:
    notes = audit.tables["misconceptions"]
    [evidence] = notes.loc[notes["misconception"].str.startswith(claim_start), "evidence"]
    return evidence


def test_leaky_date_model_fails_validity_and_says_so(leaky_date_audit):
    audit = leaky_date_audit
    assert audit.verdicts["validity"] == FAIL
    verdicts = audit.tables["verdicts"].set_index("verdict")
    # the explanation verdict is a claim status: no claim holds on invalid weights
    assert verdicts.loc["explanation", "status"] == NOT_SUPPORTED
    assert verdicts.loc["explanation", "answer"].startswith("Not meaningful")
    assert "fails the validity checks" in verdicts.loc["explanation", "answer"]
    independent = _evidence(audit, "Attention weights are independent")
    assert SUM_TO_ONE not in independent
    assert "fails validity (masked_mass at attend" in independent


def test_healthy_date_model_keeps_the_claims():
    audit = attnaudit.audit(date_target(limit=6, batch_size=6), interventions=False,
                            progress=False)
    assert audit.verdicts["validity"] == "pass"
    assert not audit.tables["verdicts"].set_index("verdict").loc[
        "explanation", "answer"].startswith("Not meaningful")
    assert SUM_TO_ONE in _evidence(audit, "Attention weights are independent")


def test_rows_off_one_are_counted_not_claimed():
    target = load_target(TOY_WRONG_AXIS)
    audit = attnaudit.audit(target, interventions=False, progress=False)
    assert audit.verdicts["validity"] == FAIL
    assert audit.tables["verdicts"].set_index("verdict").loc[
        "explanation", "answer"].startswith("Not meaningful")
    # independent ground truth: the toy's weights recomputed by hand over the query axis
    errors = []
    for batch in target.iter_batches():
        emitted = target.greedy(batch)
        start = torch.full_like(emitted[:, :1], 1)  # the toy's BOS
        queries = target.model.tgt_embed(torch.cat([start, emitted[:, :-1]], 1)).double()
        keys = target.model.src_embed(batch.source_ids).double()
        e = torch.exp(queries @ keys.transpose(1, 2) / np.sqrt(keys.shape[-1]))
        weights = e / e.sum(1, keepdim=True)
        mask = target.step_mask(emitted)
        errors.append((weights.sum(-1) - 1).abs()[mask].detach().numpy())
    errors = np.concatenate(errors)
    evidence = _evidence(audit, "Attention weights are independent")
    assert SUM_TO_ONE not in evidence
    assert evidence.startswith(f"{int((errors > 1e-3).sum())} of {errors.size} counted rows "
                               "do not sum to one")
