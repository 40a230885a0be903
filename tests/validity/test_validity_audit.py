"""The validity audit's numbers against independent references (numpy, hand counts)."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from dataclasses import replace

import numpy as np
import pytest
import torch

import attnaudit
from attnaudit.errors import TargetError
from attnaudit.record import Role, Site
from attnaudit.targets.loading import load_target
from attnaudit.validity.findings import Finding
from attnaudit.validity.gate import GateResult
from attnaudit.validity.pipeline import run_validity_audit
from attnaudit.validity.rules import site_role
from attnaudit_examples.date.data import year_span
from tests.helpers.fingerprints import assert_unchanged, model_fingerprint
from tests.helpers.toys.masking import SOURCES, make_target
from tests.helpers.toys.masking_reference import toy_weights

SITE = "attend:cross"


def metric(audit, name: str):
    frame = audit.metrics
    return frame[(frame["site"] == SITE) & (frame["metric"] == name)].sort_values("step")


@pytest.fixture(scope="module")
def leaky_audit():
    return run_validity_audit(make_target("after_softmax"), progress=False)


def test_masked_mass_of_a_mask_applied_after_softmax(leaky_audit):
    reference = toy_weights("after_softmax")
    masked = np.concatenate([np.where(pad[:, None, :], w, 0.0).sum(-1)[counted]
                             for w, pad, counted in reference])
    frame = metric(leaky_audit, "masked_mass")
    assert frame["n"].sum() == masked.size  # steps after EOS are not counted
    assert frame["sum"].sum() == pytest.approx(masked.sum(), abs=1e-5)
    assert frame["max"].max() == pytest.approx(masked.max(), abs=1e-6)
    summary = leaky_audit.site_summary.set_index("site").loc[SITE]
    assert summary["masked_rows"] == (masked > 1e-6).sum() > 0
    assert summary["rows"] == masked.size
    # the softmax output itself sums to one: the leak is in the mask, not the row sums
    assert summary["row_sum_rows"] == 0


def test_zero_filled_scores_leak_and_show_their_fill():
    audit = run_validity_audit(make_target("zero_fill"), progress=False, timing=False)
    masked = np.concatenate([np.where(pad[:, None, :], w, 0.0).sum(-1)[counted]
                             for w, pad, counted in toy_weights("zero_fill")])
    summary = audit.site_summary.set_index("site").loc[SITE]
    assert summary["masked_rows"] == (masked > 1e-6).sum() > 0
    assert summary["masked_mass_max"] == pytest.approx(masked.max(), abs=1e-6)
    assert summary["mask_fill"] == "0"  # the score every padding key got


def test_counts_per_step_follow_the_first_eos(leaky_audit):
    reference = toy_weights("after_softmax")
    per_step = sum(counted.sum(0) for _, _, counted in reference)
    frame = metric(leaky_audit, "non_finite")
    assert frame["n"].tolist() == [int(n) for n in per_step if n]


def test_findings_fail_only_the_masking_check(leaky_audit):
    statuses = {f.check: f.status for f in leaky_audit.findings()}
    assert statuses == {"non_finite": "pass", "masked_mass": "fail", "row_sum": "pass",
                        "all_masked_nan": "pass", "negative": "pass", "softmax_axis": "pass",
                        "eligibility": "pass"}
    assert not leaky_audit.healthy
    with pytest.raises(ValueError, match="rows were counted at max_masked_mass=1e-06"):
        leaky_audit.findings(max_masked_mass=0.5)


def test_entropy_of_correctly_masked_rows_matches_scipy_definition():
    audit = run_validity_audit(make_target("correct"), progress=False)
    entropies = []
    for weights, pad, counted in toy_weights("correct"):
        for b, t in zip(*np.nonzero(counted), strict=True):
            w = weights[b, t][~pad[b]]
            if w.size >= 2:
                entropies.append(-(w * np.log(w + 1e-10)).sum() / math.log(w.size))
    frame = metric(audit, "entropy_norm")
    assert frame["n"].sum() == len(entropies)
    assert frame["sum"].sum() == pytest.approx(sum(entropies), abs=1e-5)
    assert audit.healthy
    assert audit.site_summary.loc[0, "mask_fill"] == "-inf"


def test_nan_on_an_empty_source_is_an_all_masked_nan_row():
    audit = run_validity_audit(make_target("correct", (*SOURCES, [])),
                               progress=False)
    reference = toy_weights("correct", empty_source=True)
    nan_rows = sum(int(np.isnan(w).any(-1)[counted].sum()) for w, _, counted in reference)
    summary = audit.site_summary.set_index("site").loc[SITE]
    assert nan_rows > 0
    assert summary["all_masked_rows"] == summary["all_masked_nan"] == nan_rows
    assert summary["non_finite_rows"] == nan_rows
    assert summary["all_masked_behaviour"] == "NaN"
    failing = {f.check for f in audit.findings() if f.status == "fail"}
    assert failing == {"non_finite", "all_masked_nan"}
    # non-finite rows are counted, never averaged into a summary
    assert math.isfinite(summary["entropy_norm_mean"])


def test_date_model_audit_tables_and_model_unchanged():
    target = load_target(None)
    before = model_fingerprint(target.model)
    audit = run_validity_audit(target, limit=12, progress=False)
    assert_unchanged(target.model, before)
    assert audit.examples == 12 and audit.healthy
    site = audit.sites.set_index("site").loc[SITE]
    assert (site["role"], site["mechanism"], site["heads"]) == ("cross", "softmax", 1)
    assert not site["scores_materialised_by_capture"]
    assert site["eligibility"] == "declared: real source tokens"
    # region mass of the first four steps on the source year, from a plain capture
    batch = next(target.iter_batches(12))
    emitted = target.greedy(batch)
    with torch.no_grad(), attnaudit.capture(target.model, kinds=target.kinds) as cap:
        target.teacher_forced(batch, emitted)
    weights = cap.records[SITE].weights[:, 0, :4].double().numpy()
    year = np.zeros(weights.shape[::2], dtype=bool)
    for b, text in enumerate(batch.texts):
        year[b, list(year_span(text))] = True
    expected = (weights * year[:, None, :]).sum(-1)
    regions = audit.regions
    per_head = regions[(regions["site"] == SITE) & (regions["metric"] == "region_mass")]
    assert per_head["n"].sum() == expected.size
    assert per_head["sum"].sum() == pytest.approx(expected.sum(), abs=1e-6)
    averaged = regions[(regions["site"] == SITE + ":head_mean")
                       & (regions["metric"] == "region_mass")]
    assert averaged["sum"].sum() == pytest.approx(expected.sum(), abs=1e-6)  # one head
    # the kept example: its real tokens, rows summing to one
    example = audit.example.maps[SITE]
    n_src = int(batch.source_mask[0].sum())
    assert example.weights.shape == (1, emitted.shape[1], n_src)
    assert len(example.key_labels) == n_src and "".join(example.key_labels) == batch.texts[0]
    np.testing.assert_allclose(example.weights.sum(-1), 1.0, atol=1e-5)
    perf = audit.performance
    assert perf["examples"].sum() == 12
    assert perf["source_tokens"].sum() == int(batch.source_mask.sum())
    assert perf["target_tokens"].sum() == int(target.step_mask(emitted).sum())
    assert (perf[["greedy_s", "plain_s", "captured_s"]] > 0).all().all()
    assert (perf["materialised_sites"] == 0).all()


@pytest.mark.parametrize(("queries", "keys", "name", "role"), [
    (7, 5, "attend", "cross"),
    (5, 5, "enc.layers.0.self_attn", "encoder_self"),
    (7, 7, "dec.layers.0.self_attn", "decoder_self"),
    (6, 6, "model.encoder.layers.0.self_attn", "encoder_self"),
    (6, 6, "model.decoder.layers.0.self_attn", "decoder_self"),
    (6, 6, "block.attn", "captured"),
    (3, 9, "attend", "captured"),
])
def test_site_roles_by_shape_then_name(queries, keys, name, role):
    n_source, n_target = (6, 6) if queries == keys == 6 else (5, 7)
    kind = "cross" if name == "attend" else "self"
    site = Site(name, kind, "softmax", name)
    assert site_role(site, queries, keys, n_source, n_target) == role


def test_a_prefix_view_is_decoder_self_attention_by_the_role_capture_gave_it():
    # square (T, T) == (n, n): the name says nothing, the view's record role decides
    view = Site("h.0.attn:self", "self", "sdpa", "h.0.attn", role=Role.CONTINUATION)
    assert site_role(view, 4, 4, 4, 4) == Role.DECODER_SELF == "decoder_self"
    assert site_role(replace(view, role=None), 4, 4, 4, 4) == Role.CAPTURED


def test_bad_target_outputs_are_target_errors():
    target = make_target("correct")
    with pytest.raises(TargetError, match="greedy failed: RuntimeError: boom"):
        run_validity_audit(target.with_options(greedy=_boom), progress=False)
    with pytest.raises(TargetError, match=r"greedy must return integer ids of shape"):
        run_validity_audit(target.with_options(greedy=lambda b: torch.zeros(len(b))),
                           progress=False)
    with pytest.raises(TargetError, match="yielded no examples"):
        run_validity_audit(target.with_options(batches=lambda: []), progress=False)
    with pytest.raises(ValueError, match="limit must be a positive number"):
        run_validity_audit(target, limit=0)


def test_a_target_without_attention_is_a_capture_error(capsys):
    target = make_target("correct")
    silent = target.with_options(teacher_forced=lambda b, e: torch.zeros(*e.shape, 8))
    with pytest.raises(attnaudit.NoAttentionFound, match="no attention site found"):
        run_validity_audit(silent, progress=False)
    assert capsys.readouterr().err == ""


def _boom(batch):
    raise RuntimeError("boom")


def test_junit_escapes_names_and_details(leaky_audit):
    nasty = '<script>alert("x")</script> & co'
    findings = [Finding(nasty, "masked_mass", "fail", 3, nasty, 0.5),
                Finding("s", "negative", "warn", 1, "careful <b>"),
                Finding("s", "row_sum", "pass", 0, "ok")]
    result = GateResult(nasty, leaky_audit.examples, leaky_audit.sites, findings,
                        leaky_audit.max_masked_mass, leaky_audit.row_sum_tolerance)
    root = ET.fromstring(result.junit_xml(1.5))
    cases = root.findall("./testsuite/testcase")
    assert cases[0].get("classname") == f"attnaudit.{nasty}.{nasty}"
    assert cases[0].find("failure").get("message") == f"3 rows: {nasty}"
    assert cases[1].find("failure") is None
    assert cases[1].find("system-out").text == "warning: careful <b>"
    assert root.find("testsuite").get("failures") == "1"
