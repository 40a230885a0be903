"""The gate's row-sum path: weights normalised over the wrong axis and exposed with
``attnaudit.tap`` (keys last) exit 1, naming the rows that numpy counts, and
``--row-sum-tolerance`` moves the line exactly where numpy says."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import attnaudit.cli
from tests.helpers.toys.masking import BOS, EOS, UNPADDED_SOURCES, make_target

ROOT = Path(__file__).resolve().parents[2]
SPEC = "tests.helpers.toys.masking:wrong_axis_tapped"


def numpy_row_sum_errors() -> np.ndarray:
    """|sum over keys - 1| of every counted row (steps up to the first EOS), recomputed in
    numpy: scaled dot products, softmax over the query axis as the toy (wrongly) does."""
    target = make_target("wrong_axis_tapped", UNPADDED_SOURCES)
    src_embed = target.model.src_embed.weight.detach().double().numpy()
    tgt_embed = target.model.tgt_embed.weight.detach().double().numpy()
    errors = []
    for batch in target.iter_batches():
        emitted = target.greedy(batch).numpy()
        tgt_in = np.concatenate([np.full((len(emitted), 1), BOS), emitted[:, :-1]], 1)
        scores = np.einsum("btd,bnd->btn", tgt_embed[tgt_in],
                           src_embed[batch.source_ids.numpy()]) / np.sqrt(src_embed.shape[1])
        weights = np.exp(scores - scores.max(1, keepdims=True))
        weights /= weights.sum(1, keepdims=True)  # over the queries
        for b, row in enumerate(emitted.tolist()):
            stop = row.index(EOS) + 1 if EOS in row else len(row)
            errors.extend(np.abs(weights[b, :stop].sum(-1) - 1.0))
    return np.array(errors)


def test_rows_that_do_not_sum_to_one_fail_the_gate(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    errors = numpy_row_sum_errors()
    assert attnaudit.cli.main(["check", SPEC, "--json"]) == 1
    payload = json.loads(capsys.readouterr().out)
    [found] = [f for f in payload["findings"] if f["check"] == "row_sum"]
    assert found["status"] == "fail"
    assert found["rows"] == int((errors > 1e-3).sum()) > 0
    assert payload["failing_sites"] == ["attend"]  # a tap is named by its caller
    assert payload["thresholds"]["row_sum_tolerance"] is None  # the dtype rule, per site
    assert [s["row_sum_tolerance"] for s in payload["sites"]] == [1e-3]  # float32


def test_row_sum_tolerance_option_sets_the_line(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    worst = float(numpy_row_sum_errors().max())
    assert attnaudit.cli.main(["check", SPEC, "--row-sum-tolerance", repr(worst * 1.001)]) == 0
    assert "healthy" in capsys.readouterr().out
    assert attnaudit.cli.main(["check", SPEC, "--row-sum-tolerance", repr(worst * 0.999)]) == 1
    out = capsys.readouterr().out
    assert "FAIL  attend  row_sum: 1 of" in out
    shown = float(out.split("row-sum tolerance ")[1].split()[0])
    assert shown == pytest.approx(worst * 0.999, rel=1e-5)
