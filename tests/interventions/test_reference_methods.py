"""DeepLift and GradientShap against Captum called directly, one target step at a time, on the
date BART."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from captum.attr import DeepLift, GradientShap
from torch import nn

from attnaudit.interventions import reference_methods
from attnaudit.interventions.attribution import attribute
from attnaudit.target import Batch, Seq2SeqTarget
from tests.conftest import assert_unchanged, model_fingerprint
from tests.interventions.test_attribution import PAD, TinyAttention, tiny_target
from tests.interventions.test_shared_forward import bundled, hooked_first_call


class StepProbability(nn.Module):
    """p(y_t) of example rows ``rows`` (cycled over the rows given) with the source embedding's
    first call replaced: the forward Captum sees, holding the model as a submodule."""

    def __init__(self, target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor, step: int,
                 rows: torch.Tensor) -> None:
        super().__init__()
        self.model, self.target, self.batch = target.model, target, batch
        self.emitted, self.step, self.rows = emitted, step, rows

    def forward(self, embedded: torch.Tensor) -> torch.Tensor:
        rows = self.rows[torch.arange(embedded.shape[0]) % len(self.rows)]
        module = self.target.source_embedding
        assert module is not None
        handle = hooked_first_call(module, embedded)
        try:
            logits = self.target.teacher_forced(self.batch.select(rows),
                                                self.emitted[rows, : self.step + 1])
        finally:
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


@pytest.fixture(scope="module")
def date_bart() -> tuple[Seq2SeqTarget, Batch, torch.Tensor]:
    target, batch = bundled("date_transformer")
    return target, batch, target.greedy(batch)


def captum_deeplift(target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor,
                    pad: int | None = None) -> torch.Tensor:
    """Captum's DeepLift called directly, one step at a time: (B, T, n) signed sums."""
    x, base = embedded(target, batch, pad)
    expected = torch.zeros(*emitted.shape, x.shape[1])
    for t in range(emitted.shape[1]):
        forward = StepProbability(target, batch, emitted, t, torch.arange(len(batch)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected[:, t] = DeepLift(forward).attribute(
                x.clone().requires_grad_(), baselines=base).detach().sum(-1)
    return expected * target.step_mask(emitted)[:, :, None]


def test_deeplift_equals_captum_deeplift_step_by_step(
        date_bart: tuple[Seq2SeqTarget, Batch, torch.Tensor]) -> None:
    target, batch, emitted = date_bart
    before = model_fingerprint(target.model)
    found = attribute(target, batch, emitted, ("deeplift", "input_x_gradient"),
                      detach_attention=(), internal_batch_size=4)
    assert_unchanged(target.model, before)
    assert found.baseline_id == target.model.config.pad_token_id
    expected = captum_deeplift(target, batch, emitted)
    assert expected.abs().max() > 1e-4
    torch.testing.assert_close(found.token_scores["deeplift"], expected, atol=1e-5, rtol=1e-4)
    # BART has no module Captum's rules hook: DeepLift is (x - baseline) x the gradient at x
    assert found.rule_modules == ()
    variant = found.variant("deeplift")
    assert f"token {found.baseline_id}'s embedding at every position" in variant
    assert "no nonlinearity module Captum's rules apply to" in variant


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
    target, batch, emitted = tiny_target(TanhModules())
    found = attribute(target, batch, emitted, ("deeplift",), detach_attention=())
    expected = captum_deeplift(target, batch, emitted, pad=PAD)
    torch.testing.assert_close(found.token_scores["deeplift"], expected, atol=1e-6, rtol=1e-5)
    assert found.rule_modules == ("Tanh",)
    assert "rescale rule at the model's Tanh modules" in found.variant("deeplift")
    # the same weights with functional tanh: the plain gradient, other numbers
    plain_target, _, _ = tiny_target(TinyAttention())
    plain = attribute(plain_target, batch, emitted, ("deeplift",), detach_attention=())
    assert (plain.token_scores["deeplift"] - expected).abs().max() > 1e-4


def test_gradient_shap_equals_captum_gradient_shap_with_the_same_draws(
        date_bart: tuple[Seq2SeqTarget, Batch, torch.Tensor],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Captum draws which baseline of the distribution each sample starts from and its
    alpha from numpy (np.random.choice, then np.random.uniform): seeded alike, the same draws
    are handed to attnaudit in place of its own."""
    target, batch, emitted = date_bart
    x, base = embedded(target, batch)
    n_dist, n_samples = 5, 4
    distributions = base[:, None] + 0.1 * torch.randn(
        len(batch), n_dist, *x.shape[1:], generator=torch.Generator().manual_seed(0))
    chosen = []
    for b in range(len(batch)):
        np.random.seed(100 + b)
        index = np.random.choice(n_dist, n_samples).tolist()
        alpha = torch.tensor(np.random.uniform(0.0, 1.0, n_samples), dtype=x.dtype)
        chosen.append((distributions[b, index], alpha))
    given: Iterator[tuple[torch.Tensor, torch.Tensor]] = iter(chosen)
    monkeypatch.setattr(reference_methods, "shap_draws", lambda *_: next(given))
    found = attribute(target, batch, emitted, ("gradient_shap",), shap_samples=n_samples,
                      internal_batch_size=3)  # one example's samples per pass
    expected = torch.zeros(found.token_scores["gradient_shap"].shape)
    for b in range(len(batch)):
        for t in range(emitted.shape[1]):
            forward = StepProbability(target, batch, emitted, t, torch.tensor([b]))
            np.random.seed(100 + b)
            expected[b, t] = GradientShap(forward).attribute(
                x[b : b + 1], baselines=distributions[b], n_samples=n_samples,
                stdevs=0.0).detach()[0].sum(-1)
    expected *= target.step_mask(emitted)[:, :, None]
    assert expected.abs().max() > 1e-4
    torch.testing.assert_close(found.token_scores["gradient_shap"], expected, atol=1e-5,
                               rtol=1e-4)


def test_gradient_shap_draws_are_seeded_per_example_not_per_batch(
        date_bart: tuple[Seq2SeqTarget, Batch, torch.Tensor]) -> None:
    target, batch, emitted = date_bart
    whole = attribute(target, batch, emitted, ("gradient_shap",), shap_samples=3,
                      shap_stdev=0.2)
    alone = attribute(target, batch.select(torch.tensor([2])), emitted[2:], ("gradient_shap",),
                      shap_samples=3, shap_stdev=0.2, first_example=2)
    width = alone.token_scores["gradient_shap"].shape[2]
    torch.testing.assert_close(alone.token_scores["gradient_shap"][0],
                               whole.token_scores["gradient_shap"][2, :, :width],
                               atol=1e-6, rtol=1e-5)
    other = attribute(target, batch, emitted, ("gradient_shap",), shap_samples=3,
                      shap_stdev=0.2, seed=target.seed + 1)
    assert not torch.equal(other.token_scores["gradient_shap"],
                           whole.token_scores["gradient_shap"])
    variant = whole.variant("gradient_shap")
    assert "standard deviation 0.2" in variant and "3 samples per example" in variant
    assert f"token {whole.baseline_id}'s embedding" in variant
    with pytest.raises(ValueError, match="shap_stdev"):
        attribute(target, batch, emitted, ("gradient_shap",), shap_stdev=-1.0)


def test_suite_and_cli_run_the_methods_asked_for(
        date_bart: tuple[Seq2SeqTarget, Batch, torch.Tensor],
        capsys: pytest.CaptureFixture[str]) -> None:
    from attnaudit.cli import main
    from attnaudit.interventions.attribution import AttributionOptions
    from attnaudit.interventions.suite import run_suite

    target, _, _ = date_bart
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
