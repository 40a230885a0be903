"""Decoder-only targets (prompt -> continuation) for a GPT-2 and a Llama-architecture model
built from tiny configs: the prompt views capture shows equal the model's own eager
attention, the permutation / uniform / zeroing protocols equal a hand-written re-run of the
model with the edited row, and the CLI commands run on a saved checkpoint folder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

import attnaudit
from attnaudit.attribution.methods import attribute
from attnaudit.attribution.options import AttributionOptions
from attnaudit.interventions.ablation import uniform_test, zeroing_test
from attnaudit.interventions.permutation import _PermutationEdit, permutation_test
from attnaudit.interventions.reference_run import RowIndex, reference
from attnaudit.targets.hf.loading import from_hf
from attnaudit.validity.pipeline import run_validity_audit

transformers = pytest.importorskip("transformers")

from tests.helpers.tiny_hf import VOCAB, save_checkpoint  # noqa: E402

PROMPTS = ["w5 w6 w7 w8 w9", "w10 w11", "w12 w13 w14 w15"]
NEW_TOKENS = 4


def config(name: str, backend: str):
    common = {"vocab_size": VOCAB, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
              "attn_implementation": backend}
    if name == "gpt2":
        return transformers.GPT2Config(n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                       initializer_range=0.3, **common)
    return transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2,
                                    max_position_embeddings=32, initializer_range=0.3, **common)


MODEL_CLASSES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def saved(request, tmp_path_factory) -> tuple[str, Path]:
    folder = tmp_path_factory.mktemp(request.param)
    save_checkpoint(getattr(transformers, MODEL_CLASSES[request.param]),
                    config(request.param, "sdpa"), folder, eos_after=False)
    return request.param, folder


def loaded(name: str, folder: Path, backend: str) -> torch.nn.Module:
    cls = getattr(transformers, MODEL_CLASSES[name])
    return cls.from_pretrained(folder, attn_implementation=backend).eval()


def target_of(name: str, folder: Path):
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    return from_hf(loaded(name, folder, "sdpa"), PROMPTS, tokenizer=tokenizer,
                   max_new_tokens=NEW_TOKENS)


def hf_inputs(ids: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """As generate() prepares a left-padded batch: position ids count real tokens."""
    positions = mask.long().cumsum(-1) - 1
    return {"input_ids": ids, "attention_mask": mask.long(),
            "position_ids": positions.masked_fill(mask == 0, 1)}


def test_views_equal_eager_output_attentions_with_left_padding(saved):
    name, folder = saved
    target = target_of(name, folder)
    truth_model = loaded(name, folder, "eager")
    batch = next(target.iter_batches())
    assert not batch.source_mask[1, :3].any()  # left padding
    emitted = target.greedy(batch)
    n_prompt, n_steps = batch.source_ids.shape[1], emitted.shape[1]
    ids = torch.cat([batch.source_ids, emitted[:, :-1]], 1)
    mask = torch.cat([batch.source_mask, torch.ones_like(emitted[:, :-1], dtype=torch.bool)], 1)
    with torch.no_grad():
        truth = truth_model(**hf_inputs(ids, mask), output_attentions=True)
        with attnaudit.capture(target.model) as cap:
            logits = target.teacher_forced(batch, emitted)
    rows = slice(n_prompt - 1, None)
    assert (logits - truth.logits[:, rows]).abs().max() <= 1e-5
    assert torch.equal(truth.logits[:, rows].argmax(-1), emitted)  # greedy = teacher-forced
    assert len(cap.records) == 4
    for layer, full in enumerate(truth.attentions):
        prompt, prefix = full[:, :, rows, :n_prompt], full[:, :, rows, n_prompt - 1:]
        for kind, block in (("cross", prompt), ("self", prefix)):
            record = next(r for r in cap.records.values()
                          if r.kind == kind and f".{layer}." in r.name)
            expected = block / block.sum(-1, keepdim=True)
            assert record.weights.shape == expected.shape
            assert (record.weights - expected).abs().max() <= 1e-5, (kind, layer)
    cross = next(r for r in cap.records.values() if r.kind == "cross")
    assert cross.weights.shape == (3, 4, n_steps, n_prompt)
    assert cross.weights[1, :, :, :3].abs().max() == 0  # padding keys hold nothing
    assert not cross.key_mask.expand_as(cross.weights)[1, :, :, :3].any()


def test_an_empty_prompt_is_degenerate_and_square_prefix_views_are_decoder_self(saved):
    name, folder = saved
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    with pytest.warns(UserWarning, match="1 of 3 sources into special tokens only"):
        target = from_hf(loaded(name, folder, "sdpa"), ["w5 w6 w7", " ", "w8"],
                         tokenizer=tokenizer, max_new_tokens=3)
    batch = next(target.iter_batches())
    assert target.greedy(batch).shape[1] == batch.source_ids.shape[1] == 3  # (T, T) = (P, P)
    audit = run_validity_audit(target, progress=False)
    roles = dict(zip(audit.sites["site"], audit.sites["role"], strict=True))
    assert sorted(set(roles.values())) == ["cross", "decoder_self"]
    assert all(roles[n] == ("cross" if n.endswith(":cross") else "decoder_self") for n in roles)
    assert [f for f in audit.findings() if f.status != "pass"] == []
    assert audit.degenerate.counts["no eligible key"] == 3  # the empty prompt's steps


@pytest.mark.parametrize("saved", ["gpt2"], indirect=True)  # views do not depend on it
def test_a_raw_row_that_does_not_sum_to_one_fails_the_row_sum_check_in_both_views(saved):
    """A GPT-2 whose attention rows sum to 0.8 (weights declared with ``tap`` after a faulty
    rescaling): each view keeps the raw row's total, so the row-sum check fails at every
    continuation row of every view, however the view is renormalised."""
    name, folder = saved
    module = sys.modules[type(loaded(name, folder, "eager")).__module__]
    original = module.eager_attention_forward

    def faulty(mod, query, key, value, attention_mask, scaling=None, dropout=0.0, **_):
        scores = query @ key.transpose(-1, -2) * scaling + attention_mask
        scores = scores - scores.amax(-1, keepdim=True)
        weights = scores.exp() / scores.exp().sum(-1, keepdim=True) * 0.8
        weights = attnaudit.tap(f"transformer.h.{mod.layer_idx}.attn", weights)
        return (weights @ value).transpose(1, 2).contiguous(), weights

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    target = from_hf(loaded(name, folder, "eager"), PROMPTS, tokenizer=tokenizer,
                     max_new_tokens=NEW_TOKENS)
    module.eager_attention_forward = faulty
    try:
        batch = next(target.iter_batches())
        emitted = target.greedy(batch)
        with torch.no_grad(), attnaudit.capture(target.model) as cap:
            target.teacher_forced(batch, emitted)
        audit = run_validity_audit(target, progress=False)
    finally:
        module.eager_attention_forward = original
    assert sorted(r.kind for r in cap.records.values()) == ["cross"] * 2 + ["self"] * 2
    for record in cap.records.values():
        assert (record.weights.sum(-1) - 0.8).abs().max() <= 1e-5, record.name
    row_sum = {f.site: f for f in audit.findings() if f.check == "row_sum"}
    rows = {s: int(n) for s, n in zip(audit.site_summary["site"], audit.site_summary["rows"],
                                      strict=True)}
    assert sorted(row_sum) == sorted(rows) and len(rows) == 4
    for site, finding in row_sum.items():
        assert finding.status == "fail" and finding.rows == rows[site] > 0, finding
        assert abs(finding.value - 0.2) <= 1e-5


def hand_edited_probs(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor,
                      row: int, n_prompt: int, edit=None) -> torch.Tensor:
    """p(. | prompt, prefix) at position ``row``, eager attention written out by hand, with
    each layer's weights of row ``row`` over the prompt keys (H, P), as they are in this
    run, replaced by ``edit(layer, weights)``."""
    module = sys.modules[type(model).__module__]

    def attention(mod, query, key, value, attention_mask, scaling=None, dropout=0.0, **_):
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
        scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
        scores = query @ key.transpose(-1, -2) * scaling + attention_mask
        weights = torch.softmax(scores.float(), -1)
        if edit is not None:
            weights = weights.clone()
            weights[0, :, row, :n_prompt] = edit(mod.layer_idx, weights[0, :, row, :n_prompt])
        return (weights.to(value.dtype) @ value).transpose(1, 2).contiguous(), weights

    original = module.eager_attention_forward
    module.eager_attention_forward = attention
    try:
        with torch.no_grad():
            logits = model(**hf_inputs(ids[None], mask[None])).logits[0, row]
    finally:
        module.eager_attention_forward = original
    return torch.softmax(logits.float(), -1)


def tvd(p: torch.Tensor, q: torch.Tensor) -> float:
    return 0.5 * float((p - q).abs().sum())


def test_protocols_equal_a_hand_written_rerun(saved):
    name, folder = saved
    target = target_of(name, folder)
    truth_model = loaded(name, folder, "eager")
    batch = next(target.iter_batches())
    ref = reference(target, batch)
    assert ref.states is not None  # edited steps run one position from the cache
    rows = RowIndex(torch.tensor([0, 1, 2]), torch.tensor([0, 2, 1]))
    n_perm = 3
    permutation = permutation_test(target, ref, rows, n_permutations=n_perm)
    uniform = uniform_test(target, ref, rows)
    zeroing = zeroing_test(target, ref, rows)
    rerun = reference(target, batch, incremental=False)  # the prefix re-run path
    assert rerun.states is None
    for got, again in ((permutation, permutation_test(target, rerun, rows,
                                                      n_permutations=n_perm)),
                       (uniform, uniform_test(target, rerun, rows)),
                       (zeroing, zeroing_test(target, rerun, rows))):
        tvds = [c for c in got.columns if c.endswith("_tvd")]
        assert (got[tvds] - again[tvds]).abs().max().max() <= 1e-5
    draws = _PermutationEdit(ref, rows, n_perm)
    n_prompt = batch.source_ids.shape[1]
    n_layers = len(ref.sites)
    for i, (example, step) in enumerate(zip(rows.example.tolist(), rows.step.tolist(),
                                            strict=True)):
        ids = torch.cat([batch.source_ids[example], ref.emitted[example, :step]])
        mask = torch.cat([batch.source_mask[example], torch.ones(step, dtype=torch.bool)])
        row = n_prompt - 1 + step
        real = batch.source_mask[example]

        def change(edit, ids=ids, mask=mask, row=row):
            before = hand_edited_probs(truth_model, ids, mask, row, n_prompt)
            return tvd(before, hand_edited_probs(truth_model, ids, mask, row, n_prompt, edit))

        # permutation r: each layer's and head's prompt weights shuffled among real keys
        perms = draws.permutations(i).reshape(n_perm, n_layers, -1, n_prompt)
        changes = sorted(change(lambda layer, w, r=r, p=perms: w.gather(-1, p[r, layer]))
                         for r in range(n_perm))
        assert permutation["perm_median_tvd"][i] == pytest.approx(changes[1], abs=1e-5)
        # uniform: the prompt mass spread evenly over the real prompt keys
        expected = change(lambda layer, w, real=real: w.sum(-1, keepdim=True) * real
                                                     / real.sum())
        assert uniform["uniform_tvd"][i] == pytest.approx(expected, abs=1e-5)
        assert expected > 1e-3  # the edits change the output
        # zeroing: the top prompt key (mean over layers and heads of the unedited,
        # prompt-renormalised rows) set to 0, the rest rescaled to the prompt's mass
        with torch.no_grad():
            full = truth_model(**hf_inputs(ids[None], mask[None]), output_attentions=True)
        raw = torch.stack([a[0, :, row, :n_prompt] for a in full.attentions])
        top = int((raw / raw.sum(-1, keepdim=True)).mean((0, 1)).masked_fill(~real, -1)
                  .argmax())

        def zero_top(layer, w, top=top):
            kept = w.clone()
            kept[:, top] = 0
            return kept / kept.sum(-1, keepdim=True) * w.sum(-1, keepdim=True)

        assert zeroing["zero_top_tvd"][i] == pytest.approx(change(zero_top), abs=1e-5)


def hand_input_x_gradient(target, batch, emitted: torch.Tensor, pick
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Input x gradient (signed sums) of ``pick(probs (B, V), t)`` (B,) at each step t, by
    the model's own autograd on prompt + emitted[:, :-1]: at the prompt tokens (B, T, P) and
    at the steps' inputs (B, T, T), position j >= 1 being emitted token j - 1 (position 0,
    the prompt's last token, is a prompt token: 0 there)."""
    model = target.model
    n_prompt, n_steps = batch.source_ids.shape[1], emitted.shape[1]
    embed = model.get_input_embeddings()
    prompt = embed(batch.source_ids).detach().requires_grad_()
    prefix = embed(emitted[:, :-1]).detach().requires_grad_()
    mask = torch.cat([batch.source_mask, torch.ones_like(emitted[:, :-1], dtype=torch.bool)], 1)
    inputs = hf_inputs(torch.zeros_like(mask, dtype=torch.long), mask)
    del inputs["input_ids"]
    probs = torch.softmax(model(inputs_embeds=torch.cat([prompt, prefix], 1),
                                **inputs).logits[:, n_prompt - 1:].float(), -1)
    at_prompt = torch.zeros(len(emitted), n_steps, n_prompt)
    at_prefix = torch.zeros(len(emitted), n_steps, n_steps)
    for t in range(n_steps):
        grads = torch.autograd.grad(pick(probs[:, t], t).sum(), (prompt, prefix),
                                    retain_graph=True)
        at_prompt[:, t] = (grads[0] * prompt).sum(-1)
        at_prefix[:, t, 1:] = (grads[1] * prefix).sum(-1)
    return at_prompt.detach(), at_prefix.detach()


def test_contrastive_input_x_gradient_on_a_causal_lm_equals_a_hand_gradient(saved):
    """Contrast continuations (tokenized alone) and p(y_t) - p(c_t) after the emitted prefix:
    input x gradient at the prompt embeddings equals the model's own autograd, by hand."""
    name, folder = saved
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    foils = ["w20 w21", "w22", "w23 w24 w25 w26 w27"]
    target = from_hf(loaded(name, folder, "sdpa"), PROMPTS, tokenizer=tokenizer,
                     max_new_tokens=NEW_TOKENS, contrast=foils)
    batch = next(target.iter_batches())
    by_hand = [tokenizer(f, add_special_tokens=False)["input_ids"] for f in foils]
    ids = batch.inputs["contrast_ids"]
    for row, expected in zip(ids.tolist(), by_hand, strict=True):
        assert row[: len(expected)] == expected
        assert set(row[len(expected):]) <= {target.eos_id}
    emitted = target.greedy(batch)
    contrast = AttributionOptions(output="contrast").contrast_ids(batch, emitted, target.eos_id)
    found = attribute(target, batch, emitted, ("input_x_gradient",), output="contrast",
                      contrast=contrast, detach_attention=()).token_scores["input_x_gradient"]
    expected, _ = hand_input_x_gradient(
        target, batch, emitted, lambda p, t: p.gather(-1, emitted[:, t : t + 1])
        - p.gather(-1, contrast[:, t : t + 1]))
    steps = target.step_mask(emitted)[:, :, None]
    torch.testing.assert_close(found, expected * steps, atol=1e-5, rtol=0)
    assert found.abs().max() > 1e-3


def test_target_side_input_x_gradient_on_a_causal_lm_scores_the_generated_prefix(saved):
    name, folder = saved
    target = target_of(name, folder)
    batch = next(target.iter_batches())
    emitted = target.greedy(batch)
    found = attribute(target, batch, emitted, ("input_x_gradient",), detach_attention=(),
                      target_side=True)
    at_prompt, at_prefix = hand_input_x_gradient(
        target, batch, emitted, lambda p, t: p.gather(-1, emitted[:, t : t + 1]))
    steps = target.step_mask(emitted)[:, :, None]
    torch.testing.assert_close(found.token_scores["input_x_gradient"], at_prompt * steps,
                               atol=1e-5, rtol=0)
    torch.testing.assert_close(found.prefix_scores["input_x_gradient"], at_prefix * steps,
                               atol=1e-5, rtol=0)
    assert found.prefix_scores["input_x_gradient"][:, 2:].abs().max() > 1e-3
    rows = found.to_frame().query("side == 'prefix'")  # input 0 is the prompt's: not a row
    assert rows["key"].min() == 1 and (rows["key"] <= rows["step"]).all()
    valid = {(b, t) for b, t in steps[:, :, 0].nonzero().tolist() if t >= 1}
    assert set(zip(rows["example"], rows["step"], strict=True)) == valid
    sums = rows.groupby(["example", "step"])["importance"].sum()
    assert ((sums - 1).abs() < 1e-5).all()


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attnaudit", *args], capture_output=True,
                          text=True, check=False)


@pytest.mark.slow
@pytest.mark.parametrize("saved", ["gpt2"], indirect=True)  # one architecture suffices here
def test_cli_check_report_intervene_on_a_saved_gpt2(saved, tmp_path):
    _, folder = saved
    data = tmp_path / "prompts.tsv"
    data.write_text("".join(f"{p}\tw20 w21\n" for p in PROMPTS))
    common = ["--hf", str(folder), "--data", str(data), "--max-new-tokens", "3"]
    result = cli("check", *common, "--json")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    roles = {s["site"]: s["role"] for s in payload["sites"]}
    assert roles == {"transformer.h.0.attn:cross": "cross", "transformer.h.0.attn:self":
                     "decoder_self", "transformer.h.1.attn:cross": "cross",
                     "transformer.h.1.attn:self": "decoder_self"}
    assert payload["healthy"]
    out = tmp_path / "report"
    result = cli("report", *common, "--quick", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "transformer.h.0.attn:cross" in (out / "index.html").read_text()
    words = pd.read_csv(out / "word_attention.csv")  # the first prompt, word by word
    assert set(words["rule"]) == {"offsets"}
    assert list(words.loc[words["step"] == 0, "word_text"])[:5] == PROMPTS[0].split()
    sums = words.groupby(["site", "step"])["attention"].sum()
    assert ((sums - 1).abs() < 1e-5).all()  # every prompt token is in a word
    out = tmp_path / "intervene"
    foils = tmp_path / "foils.txt"
    foils.write_text("".join(f"w2{i} w30\n" for i in range(len(PROMPTS))))
    result = cli("intervene", *common, "--quick", "--out", str(out), "--attribute", "contrast",
                 "--contrast", str(foils))
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["metadata"]["attribution_output"] == "contrast"
    importance = pd.read_csv(out / "word_importance.csv")
    assert {"attention", "saliency", "loo"} <= set(importance["method"])
    attention = importance[importance["method"] == "attention"]
    assert ((attention.groupby("step")["value"].sum() - 1).abs() < 1e-5).all()


def test_a_prompt_over_the_limit_keeps_its_last_tokens(saved):
    name, folder = saved
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    prompt, keep = "w5 w6 w7 w8 w9 w10 w11", 3
    with pytest.warns(UserWarning, match=f"longer than {keep} tokens"):
        target = from_hf(loaded(name, folder, "sdpa"), [prompt, "w12"], tokenizer=tokenizer,
                         max_new_tokens=NEW_TOKENS, max_source_tokens=keep)
    batch = next(target.iter_batches())
    ids = tokenizer(prompt)["input_ids"]
    assert len(ids) > keep
    assert batch.source_ids[0].tolist() == ids[-keep:]
    assert batch.source_mask[0].all() and batch.source_mask[1].sum() == len(
        tokenizer("w12")["input_ids"])
