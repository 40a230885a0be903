"""Bad model-facts entries and capture overrides: each is refused with a message naming the
field and what it takes (a wrong type a TypeError, a wrong value a CaptureOptionError, the
table's own refusals a CaptureError), before anything is registered or patched, and the
model is left as it was."""

from __future__ import annotations

import pytest

import attnaudit
from attnaudit.capturing.model_facts import (
    ModelFacts,
    model_facts,
    register_model_facts,
    unregister_model_facts,
)
from attnaudit.errors import CaptureError, CaptureOptionError
from tests.helpers.fingerprints import assert_unchanged, model_fingerprint
from tests.helpers.toys.masking import make_target

SERVES = "a test's toy"


@pytest.mark.parametrize(("fields", "error", "message"), [
    ({"architecture": ""}, CaptureOptionError, "architecture must be a model_type or class"),
    ({"architecture": 3}, TypeError, "architecture must be a model_type or class name"),
    ({"attention": 3}, TypeError, "attention must be a pattern"),
    ({"sinks": 5}, TypeError, "sinks must be a pattern"),
    ({"not_attention": [""]}, CaptureOptionError, "not_attention: an empty pattern"),
    ({"kinds": 7}, TypeError, "kinds must map patterns to 'self' or 'cross'"),
    ({"kinds": {"*": "both"}}, CaptureOptionError, r"kinds\['\*'\] must be 'self' or 'cross'"),
    ({"pad_id": -3}, CaptureOptionError, "pad_id must be None or a token id >= 0, got -3"),
    ({"pad_id": "0"}, CaptureOptionError, "pad_id must be None or a token id >= 0"),
    ({"whole_ids_per_step": "no"}, CaptureOptionError, "whole_ids_per_step must be True"),
    ({"prefix_context": 1}, CaptureOptionError, "prefix_context must be True or False"),
])
def test_a_malformed_entry_names_its_field(fields, error, message):
    given = {"architecture": "toy_arch", "serves": SERVES, **fields}
    with pytest.raises(error, match=message):
        ModelFacts(**given)


def test_the_table_refuses_duplicates_unknown_and_built_in_removals():
    entry = ModelFacts("toy_arch", serves=SERVES)
    register_model_facts(entry)
    try:
        with pytest.raises(CaptureError, match="'toy_arch' are already registered; pass "
                                               "replace=True"):
            register_model_facts(ModelFacts("toy_arch", serves=SERVES, lead=1))
        assert model_facts("toy_arch") == entry
    finally:
        unregister_model_facts("toy_arch")
    with pytest.raises(CaptureError, match="no model facts registered for 'toy_arch'"):
        unregister_model_facts("toy_arch")
    with pytest.raises(CaptureError, match="'cpmant' are built in and stay"):
        unregister_model_facts("cpmant")
    assert model_facts("cpmant") is not None
    with pytest.raises(TypeError, match="register_model_facts takes a ModelFacts, got str"):
        register_model_facts("toy_arch")  # type: ignore[arg-type]


@pytest.mark.parametrize(("override", "error", "message"), [
    ({"include": 3}, TypeError, "include must be a pattern"),
    ({"exclude": [""]}, CaptureOptionError, "exclude: an empty pattern matches no site"),
    ({"roles": {"*": "both"}}, CaptureOptionError, r"roles\['\*'\] must be 'self' or"),
    ({"roles": "self"}, TypeError, "roles must map patterns to 'self' or 'cross'"),
    ({"roles": 5}, TypeError, "roles must map patterns"),
])
def test_a_bad_capture_override_is_refused_and_leaves_the_model(override, error, message):
    target = make_target()
    target.model.train()
    before = model_fingerprint(target.model)
    batch = next(iter(target.iter_batches(None)))
    with pytest.raises(error, match=message), attnaudit.capture(target.model, **override):
        target.greedy(batch)
    assert_unchanged(target.model, before)


def test_overrides_that_match_nothing_leave_the_sites_as_found():
    """A finding, not an error (capture does not yet say so): patterns that match no
    softmax change nothing; excluding every site is NoAttentionFound naming the search."""
    target = make_target()
    batch = next(iter(target.iter_batches(None)))
    for override in ({"include": "nothing*"}, {"exclude": "nothing*"},
                     {"roles": {"nothing*": "self"}}):
        with attnaudit.capture(target.model, **override) as cap:
            target.greedy(batch)
        assert sorted(cap.records) == ["attend"]
    with pytest.raises(attnaudit.NoAttentionFound, match="no attention site found"), \
            attnaudit.capture(target.model, exclude="*"):
        target.greedy(batch)
