"""DeepLift and GradientShap against Captum called directly, one target step at a time, on the
bundled models and a tiny model with nonlinearity modules; with target-side attribution the
decoder's input embeddings are Captum's second input."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from captum.attr import DeepLift, GradientShap
from torch import nn

from attnaudit.attribution import reference_methods
from attnaudit.attribution.methods import attribute
from attnaudit.targets.contract import Batch, Seq2SeqTarget
from tests.attribution.test_shared_forward import bundled, hooked_first_call
from tests.helpers.fingerprints import assert_unchanged, model_fingerprint
from tests.helpers.toys.attention import BOS, PAD, TinyAttention, tiny_target


def hooked_prefix(module: nn.Module, prefix: torch.Tensor) -> torch.utils.hooks.RemovableHandle:
    """A forward hook making ``module``'s calls return the decoder input embeddings ``prefix``
    (R, T, d) in order: a call giving (R, t, d) takes the next t positions, one giving (R, d)
    the next one."""
    at = [0]

    def hook(_m: nn.Module, _a: object, output: torch.Tensor) -> torch.Tensor:
        first = at[0]
        if output.ndim == 2:
            at[0] += 1
            return prefix[:, first]
        at[0] += output.shape[1]
        return prefix[:, first : at[0]]

    return module.register_forward_hook(hook)


class StepProbability(nn.Module):
    """p(y_t) of example rows ``rows`` (cycled over the rows given) with the source embedding's
    first call replaced (and, given a prefix, the decoder's input embeddings): the forward
    Captum sees, holding the model as a submodule."""

    def __init__(self, target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor, step: int,
                 rows: torch.Tensor) -> None:
        super().__init__()
        self.model, self.target, self.batch = target.model, target, batch
        self.emitted, self.step, self.rows = emitted, step, rows

    def forward(self, embedded: torch.Tensor, prefix: torch.Tensor | None = None
                ) -> torch.Tensor:
        rows = self.rows[torch.arange(embedded.shape[0]) % len(self.rows)]
        source, decoder = self.target.source_embedding, self.target.target_embedding
        assert source is not None and source is not decoder
        handles = [hooked_first_call(source, embedded)]
        if prefix is not None:
            assert decoder is not None
            handles.append(hooked_prefix(decoder, prefix))
        try:
            logits = self.target.teacher_forced(self.batch.select(rows),
                                                self.emitted[rows, : self.step + 1])
        finally:
            for handle in handles:
                handle.remove()
        return torch.softmax(logits[:, self.step].float(), -1).gather(
            -1, self.emitted[rows, self.step, None]).squeeze(-1)


def embedded(target: Seq2SeqTarget, batch: Batch, pad: int | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """The embedded source (B, n, d) and the pad baseline's embedding (default: the model's
    pad id)."""
    module = target.source_embedding
    assert module is not None
    pad = target.model.config.pad_token_id if pad is None else pad
    with torch.no_grad():
        return module(batch.source_ids), module(torch.full_like(batch.source_ids, pad))


def embedded_prefix(target: Seq2SeqTarget, emitted: torch.Tensor, start: int, pad: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """The decoder's input embeddings (B, T, d) (``start``, then the emitted ids but the last)
    and the pad baseline's embedding at every position."""
    module = target.target_embedding
    assert module is not None
    ids = torch.cat([torch.full_like(emitted[:, :1], start), emitted[:, :-1]], 1)
    with torch.no_grad():
        return module(ids), module(torch.full_like(ids, pad))


Case = tuple[Seq2SeqTarget, Batch, torch.Tensor, int, int]


def bundled_case(name: str) -> Case:
    """A bundled target, 3 sources, their greedy output, the pad and decoder start ids."""
    target, batch = bundled(name)
    if name == "date":
        from attnaudit_examples.date.data import BOS as DATE_BOS
        from attnaudit_examples.date.data import PAD as DATE_PAD

        pad, start = DATE_PAD, DATE_BOS
    else:
        pad, start = (target.model.config.pad_token_id,
                      target.model.config.decoder_start_token_id)
    return target, batch, target.greedy(batch), pad, start


@pytest.fixture(scope="module")
def date_bart() -> Case:
    return bundled_case("date_transformer")


def captum_deeplift(target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor, pad: int,
                    start: int | None = None) -> list[torch.Tensor]:
    """Captum's DeepLift called directly, one step at a time: [(B, T, n) signed sums] and, with
    ``start``, the decoder's input embeddings as a second input: [..., (B, T, T)]."""
    inputs = [embedded(target, batch, pad)]
    if start is not None:
        inputs.append(embedded_prefix(target, emitted, start, pad))
    expected = [torch.zeros(*emitted.shape, x.shape[1]) for x, _ in inputs]
    for t in range(emitted.shape[1]):
        forward = StepProbability(target, batch, emitted, t, torch.arange(len(batch)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            found = DeepLift(forward).attribute(
                tuple(x.clone().requires_grad_() for x, _ in inputs),
                baselines=tuple(base for _, base in inputs))
        for into, side in zip(expected, found, strict=True):
            into[:, t] = side.detach().sum(-1)
    steps = target.step_mask(emitted)[:, :, None]
    return [side * steps for side in expected]


@pytest.mark.parametrize("name", ["date", "date_transformer"])
def test_deeplift_without_rule_modules_equals_captum_deeplift(name: str) -> None:
    """No module Captum's rules hook: attnaudit computes DeepLift from the shared forward pass;
    it equals Captum's, on the source alone and with the decoder inputs as a second input."""
    target, batch, emitted, pad, start = bundled_case(name)
    before = model_fingerprint(target.model)
    both = attribute(target, batch, emitted, ("deeplift", "input_x_gradient"),
                     detach_attention=(), internal_batch_size=2, target_side=True)
    alone = attribute(target, batch, emitted, ("deeplift",))
    assert_unchanged(target.model, before)
    assert both.baseline_id == alone.baseline_id == pad
    source, prefix = captum_deeplift(target, batch, emitted, pad, start)
    assert source.abs().max() > 1e-4 and prefix.abs().max() > 1e-4
    assert both.prefix_scores is not None
    for found, expected in ((both.token_scores, source), (alone.token_scores, source),
                            (both.prefix_scores, prefix)):
        torch.testing.assert_close(found["deeplift"], expected, atol=1e-5, rtol=0)
    assert both.rule_modules == alone.rule_modules == ()
    variant = both.variant("deeplift")
    assert f"token {pad}'s embedding at every position" in variant
    assert "no nonlinearity module Captum's rules apply to" in variant
    assert "gradient through the attention weights" in variant


class TanhModules(TinyAttention):
    """TinyAttention with its two tanh as modules (each called once per teacher-forced
    pass), where Captum's DeepLift applies its rescale rule."""

    def __init__(self) -> None:
        super().__init__()
        self.enc_act, self.query_act = nn.Tanh(), nn.Tanh()

    def from_embedding(self, embedded: torch.Tensor, valid: torch.Tensor,
                       tgt_in: torch.Tensor) -> torch.Tensor:
        memory = self.enc_act(self.enc(embedded))
        queries = self.query_act(self.query(self.tgt_embed(tgt_in)))
        return torch.stack([self.out(torch.cat([self.attend(queries[:, t], memory, valid),
                                                queries[:, t]], -1))
                            for t in range(tgt_in.shape[1])], 1)


def test_deeplift_applies_captum_rules_at_nonlinearity_modules() -> None:
    model = TanhModules()
    target, batch, emitted = tiny_target(model)
    target = target.with_options(target_embedding=model.tgt_embed)
    before = model_fingerprint(model)
    alone = attribute(target, batch, emitted, ("deeplift",), detach_attention=())
    both = attribute(target, batch, emitted, ("deeplift",), detach_attention=(),
                     target_side=True, internal_batch_size=3)
    assert_unchanged(model, before)
    (expected,) = captum_deeplift(target, batch, emitted, pad=PAD)
    source, prefix = captum_deeplift(target, batch, emitted, pad=PAD, start=BOS)
    assert both.prefix_scores is not None
    for found, wanted in ((alone.token_scores, expected), (both.token_scores, source),
                          (both.prefix_scores, prefix)):
        torch.testing.assert_close(found["deeplift"], wanted, atol=1e-6, rtol=1e-5)
    assert alone.rule_modules == ("Tanh",)
    assert "rescale rule at the model's Tanh modules" in alone.variant("deeplift")
    # the same weights with functional tanh: (x - baseline) x the gradient, other numbers
    plain_model = TinyAttention()
    plain_target, _, _ = tiny_target(plain_model)
    plain_target = plain_target.with_options(target_embedding=plain_model.tgt_embed)
    plain = attribute(plain_target, batch, emitted, ("deeplift",), detach_attention=(),
                      target_side=True)
    assert plain.prefix_scores is not None
    assert (plain.token_scores["deeplift"] - source).abs().max() > 1e-4
    assert (plain.prefix_scores["deeplift"] - prefix).abs().max() > 1e-4


@pytest.mark.parametrize("target_side", [False, True])
def test_gradient_shap_equals_captum_gradient_shap_with_the_same_draws(
        date_bart: Case, target_side: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Captum draws which baseline of the distribution each sample starts from (one draw per
    input: np.random.choice for the source, then for the prefix) and its alpha (one for all
    inputs, np.random.uniform) from numpy: seeded alike, the same draws are handed to
    attnaudit in place of its own."""
    target, batch, emitted, pad, start = date_bart
    inputs = [embedded(target, batch, pad)]
    if target_side:
        inputs.append(embedded_prefix(target, emitted, start, pad))
    n_dist, n_samples = 5, 4
    generator = torch.Generator().manual_seed(0)
    distributions = [base[:, None] + 0.1 * torch.randn(len(batch), n_dist, *base.shape[1:],
                                                       generator=generator)
                     for _, base in inputs]
    chosen = []
    for b in range(len(batch)):
        np.random.seed(100 + b)
        index = [np.random.choice(n_dist, n_samples).tolist() for _ in inputs]
        alpha = torch.tensor(np.random.uniform(0.0, 1.0, n_samples), dtype=torch.float32)
        chosen.append(([d[b, i] for d, i in zip(distributions, index, strict=True)], alpha))
    given: Iterator[tuple[list[torch.Tensor], torch.Tensor]] = iter(chosen)
    monkeypatch.setattr(reference_methods, "shap_draws", lambda *_: next(given))
    found = attribute(target, batch, emitted, ("gradient_shap",), shap_samples=n_samples,
                      internal_batch_size=3, target_side=target_side)  # one example a pass
    expected = [torch.zeros(*emitted.shape, x.shape[1]) for x, _ in inputs]
    for b in range(len(batch)):
        for t in range(emitted.shape[1]):
            forward = StepProbability(target, batch, emitted, t, torch.tensor([b]))
            np.random.seed(100 + b)
            attributions = GradientShap(forward).attribute(
                tuple(x[b : b + 1] for x, _ in inputs),
                baselines=tuple(d[b] for d in distributions), n_samples=n_samples,
                stdevs=0.0)
            for into, side in zip(expected, attributions, strict=True):
                into[b, t] = side.detach()[0].sum(-1)
    steps = target.step_mask(emitted)[:, :, None]
    sides = [found.token_scores] + ([found.prefix_scores] if target_side else [])
    for scores, wanted in zip(sides, expected, strict=True):
        assert scores is not None and wanted.abs().max() > 1e-4
        torch.testing.assert_close(scores["gradient_shap"], wanted * steps, atol=1e-5,
                                   rtol=0)
    assert (found.prefix_scores is not None) == target_side


@pytest.mark.parametrize("target_side", [False, True])
def test_gradient_shap_draws_are_seeded_per_example_not_per_batch(date_bart: Case,
                                                                  target_side: bool) -> None:
    target, batch, emitted, _, _ = date_bart
    emitted = emitted.clone()
    emitted[2, 5] = target.eos_id  # example 2 alone runs 6 steps, the batch more
    steps = target.step_mask(emitted).sum(1)
    assert steps[2] == 6 and steps.max() > 6
    options = {"shap_samples": 3, "shap_stdev": 0.2, "target_side": target_side}
    whole = attribute(target, batch, emitted, ("gradient_shap",), **options)
    alone = attribute(target, batch.select(torch.tensor([2])), emitted[2:], ("gradient_shap",),
                      first_example=2, **options)
    width = alone.token_scores["gradient_shap"].shape[2]
    torch.testing.assert_close(alone.token_scores["gradient_shap"][0],
                               whole.token_scores["gradient_shap"][2, :, :width],
                               atol=1e-6, rtol=1e-5)
    if target_side:
        assert alone.prefix_scores is not None and whole.prefix_scores is not None
        assert alone.prefix_scores["gradient_shap"][0].abs().max() > 1e-4
        torch.testing.assert_close(alone.prefix_scores["gradient_shap"][0],
                                   whole.prefix_scores["gradient_shap"][2],
                                   atol=1e-6, rtol=1e-5)
    other = attribute(target, batch, emitted, ("gradient_shap",), seed=target.seed + 1,
                      **options)
    assert not torch.equal(other.token_scores["gradient_shap"],
                           whole.token_scores["gradient_shap"])
    variant = whole.variant("gradient_shap")
    assert "standard deviation 0.2" in variant and "3 samples per example" in variant
    assert f"token {whole.baseline_id}'s embedding" in variant
    assert ("each decoder input of a valid step" in variant) == target_side
    with pytest.raises(ValueError, match="shap_stdev"):
        attribute(target, batch, emitted, ("gradient_shap",), shap_stdev=-1.0)


def test_suite_and_cli_run_the_methods_asked_for(
        date_bart: Case, capsys: pytest.CaptureFixture[str]) -> None:
    from attnaudit.attribution.options import AttributionOptions
    from attnaudit.auditing.intervention_suite import run_suite
    from attnaudit.cli import main

    target = date_bart[0]
    asked = ("deeplift", "gradient_shap", "occlusion")
    suite = run_suite(target, quick=True, limit=2, progress=False, n_permutations=2,
                      cumulative_examples=1, attribution=AttributionOptions(methods=asked))
    assert suite.metadata["attribution_methods"] == list(asked)
    assert set(suite.metadata["attribution_variants"]) == set(asked)
    pairs = set(zip(suite.tables["agreement"].method_a, suite.tables["agreement"].method_b,
                    strict=True))
    assert {("attention", m) for m in asked} <= pairs
    default = run_suite(target, quick=True, limit=1, progress=False, n_permutations=2,
                        cumulative_examples=1)
    assert default.metadata["attribution_methods"] == ["saliency", "input_x_gradient"]
    with pytest.raises(SystemExit) as exit_code:
        main(["intervene", "--quick", "--methods", "saliency,lrp"])
    assert exit_code.value.code == 2
    assert "--methods: give distinct methods among" in capsys.readouterr().err


def test_gradient_shap_draws_equal_identically_seeded_draws() -> None:
    """Alphas ~ U(0, 1), then per side a baseline plus stdev x standard normal noise at the
    real positions only, drawn in that order from one generator."""
    base = torch.randn(6, 3, generator=torch.Generator().manual_seed(1))
    prefix = torch.randn(4, 3, generator=torch.Generator().manual_seed(2))
    real = torch.tensor([True, True, False, True, False, True])
    real_prefix = torch.tensor([True, False, True, True])
    n_samples, stdev = 5, 0.3
    starts, alphas = reference_methods.shap_draws(
        torch.Generator().manual_seed(7), [(base, real), (prefix, real_prefix)], n_samples,
        stdev)
    same = torch.Generator().manual_seed(7)
    assert torch.equal(alphas, torch.rand(n_samples, generator=same))
    for start, (side, where) in zip(starts, [(base, real), (prefix, real_prefix)],
                                    strict=True):
        noise = torch.randn(n_samples, int(where.sum()), 3, generator=same)
        expected = side.expand(n_samples, -1, -1).clone()
        expected[:, where] += stdev * noise
        torch.testing.assert_close(start, expected, rtol=0, atol=1e-7)
