"""Shared-forward attributions against Captum run one target step at a time, what is attributed
(probability, log-probability, logit, entropy, contrast) against hand-written gradients, and
target-side (output prefix) attribution."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from captum.attr import InputXGradient, IntegratedGradients, Occlusion, Saliency
from torch import nn

from attnaudit.attribution.methods import attribute
from attnaudit.attribution.options import ALL_METHODS, AttributionOptions
from attnaudit.errors import InterventionError
from attnaudit.interventions.memory import whole_passes
from attnaudit.targets.contract import Batch, Seq2SeqTarget
from tests.helpers.fingerprints import assert_unchanged, model_fingerprint
from tests.helpers.toys.attention import (
    EOS,
    PAD,
    TinyAttention,
    decoder_inputs,
    tiny_target,
)


def hooked_first_call(module: nn.Module, value: torch.Tensor) -> torch.utils.hooks.RemovableHandle:
    """A forward hook making ``module``'s first call return ``value`` (remove it after)."""
    calls = []

    def hook(_m: nn.Module, _a: object, output: torch.Tensor) -> torch.Tensor | None:
        calls.append(1)
        return value if len(calls) == 1 else None

    return module.register_forward_hook(hook)


def per_step_captum(target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor,
                    n_steps: int) -> dict[str, torch.Tensor]:
    """Captum's Saliency, InputXGradient, IntegratedGradients and Occlusion (a one-token
    window) called directly, one target step at a time: the forward teacher-forces the prefix
    up to step t and returns p(y_t). Token scores (B, T, n) as attnaudit defines them (L2
    norm; signed sums; the occlusion difference, on real tokens)."""
    module = target.source_embedding
    assert module is not None
    with torch.no_grad():
        x = module(batch.source_ids)
        base = module(torch.full_like(batch.source_ids, PAD))  # 0 in every model here
    out = {m: torch.zeros(*emitted.shape, x.shape[1])
           for m in ("saliency", "input_x_gradient", "integrated_gradients", "occlusion")}
    for t in range(emitted.shape[1]):
        def forward(embedded: torch.Tensor, t: int = t) -> torch.Tensor:
            rows = torch.arange(embedded.shape[0]) % len(batch)
            handle = hooked_first_call(module, embedded)
            try:
                logits = target.teacher_forced(batch.select(rows), emitted[rows, : t + 1])
            finally:
                handle.remove()
            return torch.softmax(logits[:, t].float(), -1).gather(
                -1, emitted[rows, t, None]).squeeze(-1)

        leaf = x.clone().requires_grad_()
        out["saliency"][:, t] = Saliency(forward).attribute(leaf, abs=False).norm(dim=-1)
        out["input_x_gradient"][:, t] = InputXGradient(forward).attribute(leaf).sum(-1)
        out["integrated_gradients"][:, t] = IntegratedGradients(forward).attribute(
            x, baselines=base, n_steps=n_steps, method="gausslegendre").sum(-1)
        window = (1, x.shape[-1])  # one token, its whole embedding
        with torch.no_grad():
            occluded = Occlusion(forward).attribute(x, sliding_window_shapes=window,
                                                    strides=window, baselines=base)
        out["occlusion"][:, t] = occluded[..., 0] * batch.source_mask
    return {m: s * target.step_mask(emitted)[:, :, None] for m, s in out.items()}


def bundled(name: str) -> tuple[Seq2SeqTarget, Batch]:
    if name == "date":
        from attnaudit_examples.date.target import make_target

        target = make_target(limit=3)
        return target, next(target.iter_batches())
    from attnaudit_examples.date_transformer.target import make_target

    target = make_target()
    return target, next(target.iter_batches(limit=3))


@pytest.mark.parametrize("name", ["date", "date_transformer"])
def test_shared_forward_equals_captum_step_by_step_on_the_bundled_models(name: str) -> None:
    target, batch = bundled(name)
    emitted = target.greedy(batch)
    before = model_fingerprint(target.model)
    # 5 sequences per pass: the 3 examples x 8 points of integrated gradients span passes
    found = attribute(target, batch, emitted, ALL_METHODS, n_steps=8, detach_attention=(),
                      internal_batch_size=5)
    assert_unchanged(target.model, before)
    expected = per_step_captum(target, batch, emitted, n_steps=8)
    for method, scores in expected.items():
        assert scores.abs().max() > 1e-4, method  # a real signal to compare
        # float32 sums in another order (shared passes vs one step at a time): scores near
        # 2 differ by about 1e-5 on some CPUs' kernels, so a relative term as well
        torch.testing.assert_close(found.token_scores[method], scores, atol=1e-5, rtol=1e-5)


def test_pass_size_follows_the_memory_budget_and_changes_nothing() -> None:
    target, batch = bundled("date_transformer")
    emitted = target.greedy(batch)
    keys = batch.source_ids.shape[1]
    small = whole_passes(target, vocab=39, keys=keys, steps=emitted.shape[1], grad=True,
                         max_memory="2MiB")
    large = whole_passes(target, vocab=39, keys=keys, steps=emitted.shape[1], grad=True,
                         max_memory="1GiB")
    assert 1 <= small < 3 < large
    runs = [attribute(target, batch, emitted, ("saliency", "integrated_gradients"), n_steps=4,
                      max_memory=memory) for memory in ("2MiB", "1GiB")]
    for method, scores in runs[0].token_scores.items():
        torch.testing.assert_close(scores, runs[1].token_scores[method], atol=1e-6, rtol=1e-5)


def hand_gradient(model: TinyAttention, batch: Batch, emitted: torch.Tensor,
                  x: torch.Tensor, score: Callable[[torch.Tensor, int, int], torch.Tensor],
                  prefix: bool = False) -> torch.Tensor:
    """d score(logits[b, t], b, t) / d (source embedding, or decoder input embedding with
    ``prefix``) per (b, t): (B, T, n or T, d), one example and step at a time."""
    tgt_in = decoder_inputs(emitted)
    width = tgt_in.shape[1] if prefix else x.shape[1]
    grads = torch.zeros(*emitted.shape, width, x.shape[-1])
    for b in range(emitted.shape[0]):
        for t in range(emitted.shape[1]):
            src_leaf = x[b : b + 1].clone().requires_grad_()
            tgt_leaf = model.tgt_embed(tgt_in[b : b + 1]).detach().requires_grad_()
            memory = torch.tanh(model.enc(src_leaf))
            query = torch.tanh(model.query(tgt_leaf[:, t]))
            valid = batch.source_mask[b : b + 1]
            logits = model.out(torch.cat([model.attend(query, memory, valid), query], -1))[0]
            leaf = tgt_leaf if prefix else src_leaf
            (grads[b, t],) = torch.autograd.grad(score(logits, b, t), leaf)
    return grads


def test_what_is_attributed_matches_hand_gradients() -> None:
    model = TinyAttention()
    target, batch, emitted = tiny_target(model)
    contrast = (emitted + 1) % EOS  # another token at every step
    with torch.no_grad():
        x = model.embed(batch.source_ids)
    steps = target.step_mask(emitted)[:, :, None]
    picks = {
        "prob": lambda lg, b, t: torch.softmax(lg, -1)[emitted[b, t]],
        "logprob": lambda lg, b, t: torch.log_softmax(lg, -1)[emitted[b, t]],
        "logit": lambda lg, b, t: lg[emitted[b, t]],
        "entropy": lambda lg, b, t: -(torch.softmax(lg, -1) * torch.log_softmax(lg, -1)).sum(),
        "contrast_logit": lambda lg, b, t: lg[emitted[b, t]] - lg[contrast[b, t]],
    }
    for output, pick in picks.items():
        found = attribute(target, batch, emitted, ("input_x_gradient",), detach_attention=(),
                          output=output,
                          contrast=contrast if output.startswith("contrast") else None)
        expected = (hand_gradient(model, batch, emitted, x, pick) * x[:, None]).sum(-1)
        torch.testing.assert_close(found.token_scores["input_x_gradient"], expected * steps,
                                   atol=1e-6, rtol=1e-5, msg=output)
        assert found.output == output and output.split("_")[0] in found.variant(
            "input_x_gradient").replace("log p", "logprob").replace("p(", "prob").lower()


def test_contrastive_saliency_is_the_difference_of_the_two_single_target_gradients() -> None:
    model = TinyAttention()
    target, batch, emitted = tiny_target(model)
    contrast = (emitted + 2) % EOS
    with torch.no_grad():
        x = model.embed(batch.source_ids)
    of_output = hand_gradient(model, batch, emitted, x,
                              lambda lg, b, t: torch.softmax(lg, -1)[emitted[b, t]])
    of_contrast = hand_gradient(model, batch, emitted, x,
                                lambda lg, b, t: torch.softmax(lg, -1)[contrast[b, t]])
    found = attribute(target, batch, emitted, ("saliency",), detach_attention=(),
                      output="contrast", contrast=contrast)
    steps = target.step_mask(emitted)[:, :, None]
    torch.testing.assert_close(found.token_scores["saliency"],
                               (of_output - of_contrast).norm(dim=-1) * steps,
                               atol=1e-6, rtol=1e-5)


def test_target_side_scores_are_gradients_at_the_decoder_inputs() -> None:
    model = TinyAttention()
    target, batch, emitted = tiny_target(model)
    target = target.with_options(target_embedding=model.tgt_embed)
    before = model_fingerprint(model)
    found = attribute(target, batch, emitted, ("saliency", "input_x_gradient",
                                               "integrated_gradients"),
                      detach_attention=(), target_side=True, n_steps=64)
    assert_unchanged(model, before)
    with torch.no_grad():
        x = model.embed(batch.source_ids)
        e = model.tgt_embed(decoder_inputs(emitted))
    grads = hand_gradient(model, batch, emitted, x,
                          lambda lg, b, t: torch.softmax(lg, -1)[emitted[b, t]], prefix=True)
    steps = target.step_mask(emitted)[:, :, None]
    assert found.prefix_scores is not None
    torch.testing.assert_close(found.prefix_scores["saliency"], grads.norm(dim=-1) * steps)
    torch.testing.assert_close(found.prefix_scores["input_x_gradient"],
                               (grads * e[:, None]).sum(-1) * steps)
    # this model's step t reads only decoder input t: every other prefix position scores 0
    off = ~torch.eye(emitted.shape[1], dtype=torch.bool)
    assert found.prefix_scores["saliency"][:, off].eq(0).all()
    # completeness over source and prefix together: the path moves both from the baseline
    with torch.no_grad():
        ids = torch.full_like(batch.source_ids, PAD)
        logits = model.from_embedding(x, batch.source_mask, decoder_inputs(emitted))
        p_x = torch.softmax(logits, -1).gather(-1, emitted[..., None]).squeeze(-1)
        base_src = model.embed(ids)
        memory = torch.tanh(model.enc(base_src))
        queries = torch.tanh(model.query(model.tgt_embed(torch.full_like(emitted, PAD))))
        base_logits = torch.stack([model.out(torch.cat([model.attend(
            queries[:, t], memory, batch.source_mask), queries[:, t]], -1))
            for t in range(emitted.shape[1])], 1)
        p_base = torch.softmax(base_logits, -1).gather(-1, emitted[..., None]).squeeze(-1)
    total = (found.token_scores["integrated_gradients"].sum(-1)
             + found.prefix_scores["integrated_gradients"].sum(-1))
    torch.testing.assert_close(total - found.convergence_delta,
                               (p_x - p_base) * steps[..., 0], atol=1e-5, rtol=0)
    assert found.convergence_delta.abs().max() < 1e-3
    frame = found.to_frame()
    prefix_rows = frame[frame.side == "prefix"]
    assert (prefix_rows.key <= prefix_rows.step).all() and len(prefix_rows) > 0


def test_inseq_variant_options() -> None:
    model = TinyAttention()
    target, batch, emitted = tiny_target(model)
    found = attribute(target, batch, emitted, ("input_x_gradient",), detach_attention=(),
                      reduction="norm", baseline=3)
    with torch.no_grad():
        x = model.embed(batch.source_ids)
    grads = hand_gradient(model, batch, emitted, x,
                          lambda lg, b, t: torch.softmax(lg, -1)[emitted[b, t]])
    steps = target.step_mask(emitted)[:, :, None]
    torch.testing.assert_close(found.token_scores["input_x_gradient"],
                               (grads * x[:, None]).norm(dim=-1) * steps)
    assert found.baseline_id == 3 and "L2 norm of the input x gradient" in found.variant(
        "input_x_gradient")


def test_bad_options_give_clear_errors() -> None:
    model = TinyAttention()
    target, batch, emitted = tiny_target(model)
    with pytest.raises(ValueError, match="needs contrast ids"):
        attribute(target, batch, emitted, output="contrast")
    with pytest.raises(ValueError, match="contrast ids were given"):
        attribute(target, batch, emitted, contrast=emitted)
    with pytest.raises(ValueError, match="contrast must be long ids"):
        attribute(target, batch, emitted, output="contrast", contrast=emitted[:, :2])
    with pytest.raises(ValueError, match="output must be one of"):
        attribute(target, batch, emitted, output="probability")
    with pytest.raises(ValueError, match="reduction must be one of"):
        attribute(target, batch, emitted, reduction="max")
    with pytest.raises(InterventionError, match="declares no unk_id"):
        attribute(target, batch, emitted, baseline="unk")
    with pytest.raises(InterventionError, match="target_embedding"):
        attribute(target, batch, emitted, target_side=True)


def test_an_audit_refuses_target_side_attribution_before_its_passes(monkeypatch) -> None:
    import attnaudit
    from attnaudit.auditing import orchestration

    target, _, _ = tiny_target(TinyAttention())

    def not_reached(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the validity pass ran")

    monkeypatch.setattr(orchestration, "run_validity_audit", not_reached)
    with pytest.raises(InterventionError, match="declares no target_embedding"):
        attnaudit.audit(target, attribution=AttributionOptions(target_side=True),
                        progress=False)


def test_contrast_outputs_from_hf_reach_the_suite(capsys: pytest.CaptureFixture[str]) -> None:
    from transformers import AutoTokenizer

    from attnaudit.auditing.intervention_suite import run_suite
    from attnaudit.cli import main
    from attnaudit.targets.hf.loading import from_hf
    from attnaudit_examples.date_transformer.model import MODEL_DIR

    sources = ["March 3, 2004", "12 Jan 1999"]
    foils = ["2004-03-04", "1999"]  # the second shorter than the output
    target = from_hf(MODEL_DIR, sources, contrast=foils)
    batch = next(target.iter_batches())
    emitted = target.greedy(batch)
    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    options = AttributionOptions(output="contrast")
    ids = options.contrast_ids(batch, emitted, target.eos_id)
    for row, foil in enumerate(foils):
        expected = tokenizer(text_target=foil)["input_ids"][: emitted.shape[1]]
        assert ids[row, : len(expected)].tolist() == expected
        assert ids[row, len(expected) :].eq(target.eos_id).all()
    found = attribute(target, batch, emitted, ("input_x_gradient",), output="contrast",
                      contrast=ids)
    suite = run_suite(target, quick=True, progress=False, n_permutations=2,
                      cumulative_examples=1,
                      attribution=AttributionOptions.variant("inseq", output="contrast",
                                                             target_side=True))
    assert suite.metadata["attribution_output"] == "contrast"
    variant = suite.metadata["attribution_variants"]["input_x_gradient"]
    assert "p(c_t" in variant and "L2 norm" in variant and "through the attention" in variant
    assert {"method", "example", "step", "key", "token_score"} <= set(
        suite.tables["attribution_prefix"].columns)
    assert found.token_scores["input_x_gradient"].abs().sum() > 0
    with pytest.raises(InterventionError, match="contrast output per source"):
        options.contrast_ids(Batch(batch.source_ids, batch.source_mask, batch.texts),
                             emitted, target.eos_id)
    code = main(["intervene", "--hf", str(MODEL_DIR), "--data",
                 "examples/date_transformer/audit.tsv", "--attribute", "contrast", "--quick"])
    assert code == 2 and "needs --contrast FILE" in capsys.readouterr().err


def test_report_command_line_keeps_the_attribution_options() -> None:
    from attnaudit.cli.app import build_parser
    from attnaudit.cli.commands import report_command_line
    from attnaudit.cli.loading import attribution_option

    argv = ["report", "--hf", "m", "--data", "d.tsv", "--contrast", "c.txt", "--attribute",
            "contrast_logit", "--attribution-variant", "inseq", "--target-side", "--methods",
            "deeplift,occlusion", "--out", "o"]
    args = build_parser().parse_args(argv)
    again = build_parser().parse_args(report_command_line(args)[1:])
    assert vars(again) | {"run": None} == vars(args) | {"run": None}
    assert attribution_option(args) == AttributionOptions(
        "contrast_logit", "norm", "unk", True, detach_attention=(),
        methods=("deeplift", "occlusion"))
    plain = build_parser().parse_args(["report", "--out", "o"])
    assert report_command_line(plain) == ["attnaudit", "report", "--out", "o"]
    assert attribution_option(plain) == AttributionOptions()
