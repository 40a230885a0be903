"""The two target families: each declares its family and its attention roles, in the one
vocabulary (``attnaudit.record.Role``) that capture records, the contribution trace and the
explorer read; nothing above the target reads the family off site names or
``first_prefix_input``."""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch

import attnaudit
from attnaudit.contributions.trace import trace
from attnaudit.record import Family, Role
from attnaudit.report.explorer import explorer_views, payload
from attnaudit.targets.contract import (
    AuditTarget,
    DecoderOnlyTarget,
    Seq2SeqTarget,
    role_title,
)
from attnaudit.targets.loading import load_target
from attnaudit.validity.pipeline import run_validity_audit

transformers = pytest.importorskip("transformers")

from tests.helpers.tiny_hf import VOCAB, save_checkpoint  # noqa: E402

PROMPTS = ["w5 w6 w7 w8 w9", "w10 w11"]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory) -> DecoderOnlyTarget:
    folder = tmp_path_factory.mktemp("gpt2")
    config = transformers.GPT2Config(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2,
                                     pad_token_id=0, n_positions=32, n_embd=32, n_layer=2,
                                     n_head=4, initializer_range=0.3)
    save_checkpoint(transformers.GPT2LMHeadModel, config, folder, eos_after=False)
    target = attnaudit.from_hf(folder, PROMPTS, max_new_tokens=4)
    assert isinstance(target, DecoderOnlyTarget)
    return target


def test_each_family_declares_its_family_and_roles_once():
    seq2seq = load_target(None)  # the date example: a hand-built Seq2SeqTarget
    assert type(seq2seq) is Seq2SeqTarget and isinstance(seq2seq, AuditTarget)
    assert seq2seq.family is Family.ENCODER_DECODER
    assert set(seq2seq.roles) == {"encoder_self", "decoder_self", "cross", "captured"}
    assert DecoderOnlyTarget.family is Family.DECODER_ONLY
    assert dict(DecoderOnlyTarget.roles) == {
        "cross": "continuation over the prompt", "decoder_self": "continuation over itself",
        "self": "self-attention", "captured": "other attention"}
    # the decoder-only names of the roles are the strings the tables already hold
    assert (Role.PROMPT, Role.CONTINUATION) == ("cross", "decoder_self")
    assert role_title(Family.DECODER_ONLY, "cross") == "continuation over the prompt"
    assert role_title(Family.ENCODER_DECODER, "cross") == "cross-attention"
    # the family is the class's, not a field a user sets or a copy loses
    assert "family" not in {f.name for f in fields(DecoderOnlyTarget)}
    assert seq2seq.with_options(seed=3).family is Family.ENCODER_DECODER


def test_a_decoder_only_target_runs_its_passes_under_views_whose_records_carry_roles(gpt2):
    batch = next(gpt2.iter_batches())
    assert gpt2.family is Family.DECODER_ONLY and isinstance(gpt2, AuditTarget)
    assert gpt2.with_options(seed=1).family is Family.DECODER_ONLY
    with torch.no_grad():
        emitted = gpt2.greedy(batch)
        with attnaudit.capture(gpt2.model) as cap:
            gpt2.teacher_forced(batch, emitted)
    roles = {name: record.site.role for name, record in cap.records.items()}
    assert roles and set(roles.values()) == {Role.PROMPT, Role.CONTINUATION}
    for name, role in roles.items():
        assert role in gpt2.roles
        assert role == ("cross" if name.endswith(":cross") else "decoder_self")
    # the raw pass has no views: sites with no role from capture
    with torch.no_grad(), attnaudit.capture(gpt2.model) as raw:
        gpt2.raw_pass(batch, emitted)
    assert raw.records and all(r.site.role is None and not name.endswith(":cross")
                               for name, r in raw.records.items())
    # one input rule: the raw pass reads the ids and positions `sequence` gives
    inputs = gpt2.sequence(batch, emitted)
    mask = inputs["attention_mask"]
    assert torch.equal(inputs["input_ids"], torch.cat([batch.source_ids, emitted[:, :-1]], 1))
    assert torch.equal(inputs["position_ids"], (mask.cumsum(-1) - 1).clamp_min(0))


def test_the_trace_reads_the_family_not_first_prefix_input_or_site_names(gpt2):
    batch = next(gpt2.iter_batches())
    emitted = gpt2.greedy(batch)
    traced = trace(gpt2.with_options(first_prefix_input=0), batch, emitted)
    assert traced.causal and traced.reading_role is Role.SELF
    assert {s.role for s in traced.sites.values()} == {Role.SELF}
    assert not any(name.endswith(":cross") for name in traced.sites)  # none to find it by
    seq2seq = load_target(None)
    one = next(seq2seq.iter_batches(2))
    traced = trace(seq2seq, one, seq2seq.greedy(one))
    assert not traced.causal and traced.reading_role is Role.CROSS
    assert {s.role for s in traced.sites.values()} <= set(seq2seq.roles)


def test_a_decoder_only_explorer_without_cross_sites_still_names_its_roles(gpt2):
    # only the continuation-over-itself views: no `:cross` site to guess the family from
    target = gpt2.with_options(sites=lambda name: name.endswith(":self"))
    audit = run_validity_audit(target, progress=False, timing=False, regions=False,
                               keep_examples=1)
    assert set(audit.sites["role"]) == {"decoder_self"}
    example = explorer_views(audit.kept_examples)[0]
    assert [(v.role, v.title, v.query_axis) for v in example.views] == [
        ("decoder_self", "continuation over itself", "Decoding step")]
    page = payload([example], max_masked_mass=None, row_sum_tolerance={})
    view = page["examples"][0]["views"][0]
    assert (view["title"], view["query_axis"]) == ("continuation over itself", "Decoding step")


def test_an_encoder_decoder_explorer_passes_its_titles_and_query_axes():
    seq2seq = load_target(None)
    audit = run_validity_audit(seq2seq, limit=2, progress=False, timing=False,
                               regions=False, keep_examples=1)
    page = payload(explorer_views(audit.kept_examples), max_masked_mass=None,
                   row_sum_tolerance={})
    views = {v["role"]: (v["title"], v["query_axis"]) for v in page["examples"][0]["views"]}
    assert views["cross"] == ("cross-attention", "Decoding step")
    for role, (title, axis) in views.items():
        assert title == seq2seq.roles[Role(role)]
        assert axis == ("Query token" if role == "encoder_self" else "Decoding step")
