"""Bad settings of :class:`attnaudit.AuditOptions` and of the three entry points that take
them (:func:`attnaudit.audit`, :func:`attnaudit.intervene`, :func:`attnaudit.plan`): each is
an attnaudit error that names the setting and what it takes, raised before any work, and
the model is left as it was (no hook, mode or parameter changed) whatever was refused."""

from __future__ import annotations

import re

import pytest

import attnaudit
from attnaudit import options
from attnaudit.errors import (
    AlignmentError,
    CaptureOptionError,
    InterventionError,
    OptionError,
    TargetError,
)
from tests.helpers.fingerprints import assert_unchanged, model_fingerprint
from tests.helpers.toys.masking import make_target


@pytest.mark.parametrize(("make", "message"), [
    (lambda: options.AuditOptions(interventions="no"), "interventions must be True or False"),
    (lambda: options.AuditOptions(max_memory=1.5), "max_memory must be a byte count"),
    (lambda: options.AuditOptions(max_memory=[1]), "max_memory must be a byte count"),
    (lambda: options.AuditOptions(gold=""), "gold must be the path of a Pharaoh file"),
    (lambda: options.Edits(heads=3.0), "heads must be distinct int values, got 3.0"),
    (lambda: options.Edits(sites=[""]), "sites must be distinct str values"),
    (lambda: options.Edits(sites={"a": 1}), "sites must be distinct str values"),
    (lambda: options.Edits(sequence_effects="y"), "sequence_effects must be True or False"),
    (lambda: options.AttributionSettings(target_side="x"), "target_side must be True or False"),
    (lambda: options.AuditOptions.from_settings({"quick": "yes"}),
     "quick must be True or False, got 'yes'"),
    (lambda: options.AuditOptions.from_settings({"checks_only": 1}),
     "checks_only must be True or False"),
    (lambda: options.AuditOptions.from_settings(None),  # type: ignore[arg-type]
     "settings must be a mapping"),
    (lambda: options.AuditOptions.from_settings({}, "quick"),  # type: ignore[arg-type]
     r"options must be an attnaudit.AuditOptions \(or None\), got 'quick'"),
])
def test_a_bad_setting_of_any_type_is_an_option_error_naming_it(make, message):
    with pytest.raises(OptionError, match=message):
        make()


def test_single_names_and_indices_are_still_taken_alone():
    assert options.Edits(sites="attend", heads=0) == options.Edits(sites=("attend",),
                                                                   heads=(0,))
    assert options.AuditOptions(max_memory="2GiB", interventions=False).max_memory == "2GiB"


@pytest.fixture
def target():
    built = make_target()
    built.model.train()  # a mode to keep: an audit runs in eval and must put it back
    return built


def _refused(model, error, message, call):
    before = model_fingerprint(model)
    with pytest.raises(error, match=message):
        call()
    assert_unchanged(model, before)


ENTRY_POINTS = {
    "audit": lambda target, **kw: attnaudit.audit(target, progress=False, **kw),
    "intervene": lambda target, **kw: attnaudit.intervene(target, progress=False, **kw),
    "plan": lambda target, **kw: attnaudit.plan(target, **kw),
}


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize(("given", "error", "message"), [
    ({"options": 3}, OptionError, "options must be an attnaudit.AuditOptions"),
    ({"limit": 0}, OptionError, "limit must be a positive number"),
    ({"max_memory": 1.5}, OptionError, "max_memory must be a byte count"),
    ({"max_memory": "lots"}, CaptureOptionError, "memory must look like 2GiB"),
    ({"quik": True}, OptionError, r"unknown (audit settings|keywords) \['quik'\]"),
    ({"attribution": "prob"}, OptionError,
     "attribution must be an attnaudit.options.AttributionSettings"),
    ({"device": 5.5}, TargetError, "unknown device 5.5: use cpu, cuda"),
    ({"options": options.AuditOptions(gold="/nonexistent/gold.txt")}, AlignmentError,
     "cannot read alignments from /nonexistent/gold.txt"),
])
def test_every_entry_point_refuses_a_bad_setting_and_leaves_the_model(target, entry, given,
                                                                      error, message):
    _refused(target.model, error, message, lambda: ENTRY_POINTS[entry](target, **given))


EDITS_THE_TARGET_LACKS = [({"sites": ["nope"]}, "site 'nope' was not seen"),
                          ({"heads": [99]}, r"heads \[99\] are not distinct head indices")]


@pytest.mark.parametrize("entry", ["intervene", "plan"])
@pytest.mark.parametrize(("given", "message"), EDITS_THE_TARGET_LACKS)
def test_the_suite_and_its_plan_refuse_edits_the_target_lacks(target, entry, given, message):
    _refused(target.model, InterventionError, message,
             lambda: ENTRY_POINTS[entry](target, quick=True, **given))


@pytest.mark.parametrize(("given", "message"), EDITS_THE_TARGET_LACKS)
def test_audit_records_edits_the_target_lacks_as_a_suite_that_did_not_run(target, given,
                                                                          message):
    before = model_fingerprint(target.model)
    found = attnaudit.audit(target, quick=True, progress=False, **given)
    assert found.suite is None
    assert found.suite_reason.startswith("the intervention suite could not run on this target")
    assert re.search(message, found.suite_reason)
    assert_unchanged(target.model, before)


def test_a_keyword_no_entry_point_knows_is_named_not_blamed_on_the_target(target):
    with pytest.raises(OptionError, match=r"unknown keywords \['gold'\]: neither this call's "
                                          r"nor from_hf's"):
        attnaudit.intervene(target, gold="g.txt", progress=False)  # a keyword of audit only
    with pytest.raises(TargetError, match=r"not with a Seq2SeqTarget \(given: batch_size\)"):
        attnaudit.audit(target, batch_size=4, progress=False)


def test_intervene_reads_the_gold_file_of_its_options(target, tmp_path):
    short = tmp_path / "gold.txt"
    short.write_text("0-0\n", encoding="utf-8")
    with pytest.raises(AlignmentError, match=r"has 1 lines but the data has 5 examples"):
        attnaudit.intervene(target, options=options.AuditOptions(gold=short), progress=False)
