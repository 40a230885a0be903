"""The model's own cached decoding against its one teacher-forced pass, a finding of the audit.

Ground truth is the checkpoint loaded a second time with the eager backend: its own
``generate(output_logits=True)`` (the cached steps) against its own forward over prompt +
continuation in one pass, the total variation per step computed here by hand. A sparse-
attention indexer (DeepSeek-V3.2: top-k keys picked from what the cache holds) and a
state-space hybrid (Zamba2: a recurrent step against a chunked scan) differ; Llama agrees.
Where they differ the positions item warns, the manifest and the item's CSV hold the
numbers, and the gate still passes.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

import attnaudit
from attnaudit.analysis.cached_decoding import (
    NOT_OFFERED,
    CachedDecoding,
    compare_cached_decoding,
    step_tolerance,
)
from attnaudit.errors import TargetError
from attnaudit.runtime.distributed import current_shard
from attnaudit.validity.pipeline import run_validity_audit

transformers = pytest.importorskip("transformers")


from tests.helpers.tiny_causal import tiny_causal_checkpoint  # noqa: E402
from tests.helpers.tiny_hf import save_checkpoint, tiny_config  # noqa: E402

# two prompts of one length: no padding, so the eager model's own calls need no mask
PROMPTS = ["w10 w11 w12 w13 w14 w15 w16 w17", "w20 w21 w22 w23 w24 w25 w26 w27"]
NEW_TOKENS = 5
TOL = 1e-4  # the audit's total variation against the one computed here


def _checkpoint(arch: str, folder: Path) -> Path:
    return tiny_causal_checkpoint(arch, folder)[0]


def _eager_gap(folder: Path) -> torch.Tensor:
    """(B, T) total variation between the eager model's generate() steps and its one pass
    over prompt + continuation; NaN after the first end-of-sequence step."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, attn_implementation="eager").eval()
    ids = tokenizer(PROMPTS, return_tensors="pt")["input_ids"]
    eos = model.config.eos_token_id
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             num_beams=1, max_new_tokens=NEW_TOKENS, output_logits=True,
                             return_dict_in_generate=True, eos_token_id=eos, pad_token_id=eos)
        emitted = out.sequences[:, ids.shape[1]:]
        steps = torch.stack(out.logits, 1).double()
        one_pass = model(input_ids=out.sequences[:, :-1]).logits[:, ids.shape[1] - 1:].double()
    gap = 0.5 * (steps.softmax(-1) - one_pass.softmax(-1)).abs().sum(-1)
    is_eos = (emitted == eos).long()
    after_eos = (is_eos.cumsum(-1) - is_eos) > 0
    return gap.masked_fill(after_eos, float("nan"))


def _positions(result: attnaudit.Audit):
    return next(i for i in result.checklist.items if i.item.key == "positions")


@pytest.mark.parametrize("arch", ["deepseek_v32", "zamba2"])
def test_cached_steps_that_differ_are_a_warning_with_their_numbers(arch, tmp_path):
    folder = _checkpoint(arch, tmp_path / arch)
    gap = _eager_gap(folder)
    counted = ~gap.isnan()
    largest = float(gap[counted].max())
    assert largest > step_tolerance(torch.float32)  # the known answer: they differ
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = attnaudit.audit(folder, PROMPTS, interventions=False, progress=False,
                                 max_new_tokens=NEW_TOKENS, decoding="greedy")
    found = result.validity.cached_decoding
    assert found.measured and found.differs
    assert found.rows == int(counted.sum())
    assert found.differing_rows == int((gap[counted] > found.tolerance).sum())
    assert abs(found.total_variation - largest) <= TOL
    assert abs(float(gap[found.example, found.step]) - largest) <= TOL
    item = _positions(result)
    assert item.status == "warn"
    line = next(o for o in item.observations if o.startswith("The model's own cached"))
    assert "differ from its one teacher-forced pass" in line
    assert f"total variation {found.total_variation:.3g} at step {found.step}" in line
    assert "generate() computed others" in line
    table = next(e.frame for e in item.evidence if e.name == "cached_decoding")
    assert table.loc[0, "differs"] and table.loc[0, "total_variation"] == found.total_variation
    recorded = result.manifest["decoding"]["cached_steps"]
    assert recorded["differs"] is True and recorded["step"] == found.step
    result.save(tmp_path / "report")
    saved = attnaudit.Audit.load(tmp_path / "report")
    assert saved.tables["cached_decoding"].equals(table)  # cached_decoding.csv, read back
    assert saved.manifest["decoding"]["cached_steps"] == recorded
    assert result.gate().status == 0  # a warning, not a gate failure
    assert result.checklist.verdicts[0].status != "fail"


def test_cached_steps_that_agree_add_no_finding(tmp_path):
    folder = _checkpoint("llama", tmp_path / "llama")
    gap = _eager_gap(folder)
    assert float(gap[~gap.isnan()].max()) <= step_tolerance(torch.float32)
    result = attnaudit.audit(folder, PROMPTS, interventions=False, progress=False,
                             max_new_tokens=NEW_TOKENS, decoding="greedy")
    found = result.validity.cached_decoding
    assert found.measured and not found.differs and found.differing_rows == 0
    assert found.total_variation <= step_tolerance(torch.float32)
    item = _positions(result)
    assert item.status == "not recorded"
    assert any("agree with its one teacher-forced pass" in o for o in item.observations)
    assert result.manifest["decoding"]["cached_steps"]["differs"] is False
    # a target that offers no cached decoding, or whose cached decoding fails, says why
    target = attnaudit.from_hf(folder, PROMPTS, max_new_tokens=NEW_TOKENS)
    plain = attnaudit.audit(target.with_options(cached_decode=None), interventions=False,
                            progress=False)
    assert plain.validity.cached_decoding == CachedDecoding(False, NOT_OFFERED)
    assert _positions(plain).evidence == []

    def failing(batch, emitted):
        raise TargetError("no cache here")

    broken = attnaudit.audit(target.with_options(cached_decode=failing), interventions=False,
                             progress=False)
    assert not broken.validity.cached_decoding.measured
    assert "no cache here" in broken.validity.cached_decoding.reason
    second = next(target.iter_batches()).source_ids[1]

    def non_finite(batch, emitted):  # one NaN step: it differs, and it is the one named
        logits = target.cached_decode(batch, emitted).clone()
        # example 1's step 0 (always counted), in whichever chunk of examples holds it
        logits[(batch.source_ids == second).all(-1), 0] = float("nan")
        return logits

    nan = run_validity_audit(target.with_options(cached_decode=non_finite), progress=False)
    assert nan.cached_decoding.differs and nan.cached_decoding.differing_rows == 1
    assert (nan.cached_decoding.example, nan.cached_decoding.step) == (1, 0)
    gate_only = attnaudit.audit(target, checks_only=True, progress=False)
    assert gate_only.manifest["decoding"]["cached_steps"] == {
        "measured": False, "reason": "the audit ran the gate's checks only"}


def test_merging_keeps_the_largest_row_and_sums_the_counts():
    one = CachedDecoding(True, rows=4, differing_rows=1, total_variation=0.2, example=0,
                         step=3, tolerance=1e-3)
    two = CachedDecoding(True, rows=6, differing_rows=2, total_variation=0.5, example=7,
                         step=1, tolerance=1e-3)
    unmeasured = CachedDecoding(False, "no emitted step to compare")
    merged = one.merged(unmeasured).merged(two)
    assert (merged.rows, merged.differing_rows) == (10, 3)
    assert (merged.total_variation, merged.example, merged.step) == (0.5, 7, 1)
    assert CachedDecoding(False, NOT_OFFERED).merged(unmeasured) == unmeasured
    broken = CachedDecoding(True, rows=1, differing_rows=1, total_variation=float("nan"),
                            example=3, step=0, tolerance=1e-3)
    assert merged.merged(broken).example == broken.merged(merged).example == 3


def test_an_encoder_decoders_cached_steps_are_compared_too(tmp_path):
    """ProphetNet's decoder runs its n-gram stream differently from its cache."""
    folder = tmp_path / "prophetnet"
    model_cls = transformers.ProphetNetForConditionalGeneration
    save_checkpoint(model_cls, tiny_config(transformers.ProphetNetConfig), folder)
    model = model_cls.from_pretrained(folder).eval()
    ids = transformers.AutoTokenizer.from_pretrained(folder)(PROMPTS, return_tensors="pt")[
        "input_ids"]
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             do_sample=False, num_beams=1, max_new_tokens=NEW_TOKENS,
                             output_logits=True, return_dict_in_generate=True)
        steps = torch.stack(out.logits, 1).double()
        one_pass = model(input_ids=ids, decoder_input_ids=out.sequences[:, :-1]).logits.double()
    emitted = out.sequences[:, 1:]
    is_eos = (emitted == model.config.eos_token_id).long()
    counted = (is_eos.cumsum(-1) - is_eos) == 0
    gap = (0.5 * (steps.softmax(-1) - one_pass.softmax(-1)).abs().sum(-1))[counted]
    assert float(gap.max()) > step_tolerance(torch.float32)
    result = attnaudit.audit(folder, PROMPTS, interventions=False, progress=False,
                             max_new_tokens=NEW_TOKENS, decoding="greedy")
    found = result.validity.cached_decoding
    assert found.differs and found.rows == len(gap)
    assert abs(found.total_variation - float(gap.max())) <= TOL
    assert _positions(result).status == "warn" and result.gate().status == 0


def test_batches_and_ranks_merge_into_one_comparison(tmp_path):
    """Two batches of the same prompts: counts double, the largest row stays the first
    batch's; a gloo group of one (every merge through the collectives) gives the same."""
    dist = pytest.importorskip("torch.distributed")
    folder = _checkpoint("deepseek_v32", tmp_path / "deepseek_v32")
    options = {"max_new_tokens": NEW_TOKENS, "decoding": "greedy", "batch_size": 2}
    one = run_validity_audit(attnaudit.from_hf(folder, PROMPTS, **options), progress=False)
    target = attnaudit.from_hf(folder, PROMPTS * 2, **options)
    plain = run_validity_audit(target, progress=False)
    assert (plain.cached_decoding.rows, plain.cached_decoding.differing_rows) == (
        2 * one.cached_decoding.rows, 2 * one.cached_decoding.differing_rows)
    assert plain.cached_decoding.example == one.cached_decoding.example
    assert plain.cached_decoding.total_variation == one.cached_decoding.total_variation
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        merged = run_validity_audit(target, progress=False,
                                    shard=current_shard(dist.group.WORLD))
    finally:
        dist.destroy_process_group()
    assert merged.cached_decoding == plain.cached_decoding


@pytest.mark.parametrize("arch", ["llama", "deepseek_v32"])
def test_the_cached_decoding_is_the_models_own_generate_on_left_padded_prompts(arch,
                                                                                tmp_path):
    """The target's step-by-step decoding against the eager model's own generate() on the
    same left-padded batch: the same tokens, the same logits at every step."""
    folder = _checkpoint(arch, tmp_path / arch)
    prompts = [PROMPTS[0], "w30 w31 w32"]
    target = attnaudit.from_hf(folder, prompts, max_new_tokens=NEW_TOKENS, decoding="greedy")
    batch = next(target.iter_batches())
    assert not batch.source_mask[:, 0].all()  # the short prompt is left-padded
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, attn_implementation="eager").eval()
    pad = int(batch.source_ids[~batch.source_mask][0])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = model.generate(input_ids=batch.source_ids,
                             attention_mask=batch.source_mask.long(), do_sample=False,
                             num_beams=1, max_new_tokens=NEW_TOKENS, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=pad,
                             eos_token_id=target.eos_id)
        emitted = out.sequences[:, batch.source_ids.shape[1]:]
        assert torch.equal(target.greedy(batch), emitted)
        cached = target.cached_decode(batch, emitted)
    steps = target.step_mask(emitted)
    own = torch.stack(out.logits, 1)
    assert (cached - own).abs()[steps].max() <= 1e-4


def test_the_cached_decoding_follows_the_given_tokens_and_stops_when_every_row_ends(tmp_path):
    """Forced along tokens the model would not pick, the cached decoding gives the eager
    model's own one-pass logits over those tokens (Llama: its steps and one pass agree);
    once every row has emitted the end-of-sequence token it stops (T' < T)."""
    folder = _checkpoint("llama", tmp_path / "llama")
    target = attnaudit.from_hf(folder, PROMPTS, max_new_tokens=NEW_TOKENS, decoding="greedy")
    batch = next(target.iter_batches())
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, attn_implementation="eager").eval()
    eos = target.eos_id
    emitted = torch.tensor([[31, 7, 19, 44, 23], [5, 52, 8, 61, 12]])
    emitted[emitted == eos] = eos + 1
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cached = target.cached_decode(batch, emitted)
        one_pass = model(input_ids=torch.cat([batch.source_ids, emitted[:, :-1]], 1)).logits
        prompt = batch.source_ids.shape[1]
        assert (cached - one_pass[:, prompt - 1 :]).abs().max() <= 1e-4
        ended = emitted.clone()
        ended[:, 1] = eos  # every row ends at step 1
        assert target.cached_decode(batch, ended).shape[:2] == (2, 2)


def test_a_small_memory_budget_compares_in_chunks_with_the_same_result(tmp_path):
    """Examples go through the comparison in chunks that hold both decodings' logits in the
    budget; the rows, the largest total variation and where it is are those of one chunk."""
    folder = _checkpoint("deepseek_v32", tmp_path / "deepseek_v32")
    prompts = [PROMPTS[0], PROMPTS[1], "w30 w31 w32 w33 w34 w35 w36 w37"]
    target = attnaudit.from_hf(folder, prompts, max_new_tokens=NEW_TOKENS, decoding="greedy")
    batch = next(target.iter_batches())
    emitted = target.greedy(batch)
    steps = target.step_mask(emitted)
    whole = compare_cached_decoding(target, batch, emitted, steps, 0, max_memory=1 << 30)
    calls = []
    decode = target.cached_decode
    counted = target.with_options(
        cached_decode=lambda b, e: calls.append(len(b)) or decode(b, e))
    vocab = target.model.config.vocab_size
    one_row = 2 * 4 * emitted.shape[1] * vocab  # both copies of one example's logits
    chunked = compare_cached_decoding(counted, batch, emitted, steps, 0, max_memory=one_row)
    assert calls == [1, 1, 1]
    assert chunked.rows == whole.rows and chunked.differing_rows == whole.differing_rows
    assert (chunked.example, chunked.step) == (whole.example, whole.step)
    assert abs(chunked.total_variation - whole.total_variation) <= 1e-6
    # the audit's own teacher-forced logits given: one float32 copy per example and chunk
    calls.clear()
    with torch.no_grad():
        logits = target.teacher_forced(batch, emitted)
    given = compare_cached_decoding(counted, batch, emitted, steps, 0,
                                    max_memory=one_row, forced=logits)
    assert calls == [2, 1] and given.rows == whole.rows  # a budget of two examples' copies
    assert abs(given.total_variation - whole.total_variation) <= 1e-6
