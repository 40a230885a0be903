"""Prompt views in absolute positions: a sliding window of 3 on a 7-token prompt (a tiny
Mistral, eager and cached) gives the same views teacher-forced and step by step from its
sliding-window cache, equal to the views of the model's own eager ``output_attentions``;
a row whose prompt mass underflows float32 (~1e-39) is renormalised exactly (no floor),
so the numerics check passes on it, and one that underflows to 0 is a zero view, not judged
by the row-sum check; a layer run twice in one pass gives a second set of
views rather than twice the rows (also HRM-text's cycles); an n-gram predict stream
(ProphetNet) is recorded as it is, not cut into views like the main stream."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import attnaudit
from attnaudit.analysis.base import AttentionRows
from attnaudit.analysis.numerics import NumericsAnalyser
from attnaudit.capturing.views import prompt_views


def hand_views(raw: torch.Tensor, prompt: int) -> dict[str, torch.Tensor]:
    """The views' rule on raw (B, H, Q, K) weights of a full pass, in float64."""
    rows = raw[:, :, prompt - 1:].double()
    total = rows.sum(-1, keepdim=True)
    out = {}
    for kind, cut in (("cross", slice(0, prompt)), ("self", slice(prompt - 1, None))):
        block = rows[..., cut]
        mass = block.sum(-1, keepdim=True)
        out[kind] = torch.where(mass == 0, 0.0, block / mass * total)
    return out


class CausalAttention(nn.Module):
    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        n = scores.shape[-1]
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        return torch.softmax(scores.masked_fill(~causal, float("-inf")), -1)


def test_a_row_whose_prompt_mass_underflows_is_renormalised_without_a_floor():
    prompt, n = 4, 6
    scores = torch.zeros(1, 1, n, n)
    scores[..., prompt:, :prompt] = -89.5  # exp(-89.5) ~ 1.3e-39: below float32's normal range
    model = CausalAttention()
    raw = model(scores)
    assert 0 < raw[0, 0, -1, :prompt].sum().item() < torch.finfo(torch.float32).tiny
    with prompt_views(prompt), attnaudit.capture(model) as cap:
        model(scores)
    cross = cap.records["forward:cross"]
    torch.testing.assert_close(cross.weights.double(), hand_views(raw, prompt)["cross"],
                               rtol=1e-6, atol=0)
    torch.testing.assert_close(cross.weights.double().sum(-1), torch.ones(1, 1, n - prompt + 1,
                                                                        dtype=torch.float64))
    rows = raw[:, :, prompt - 1:].double()
    share = rows[..., :prompt].sum(-1, keepdim=True) / rows.sum(-1, keepdim=True)
    torch.testing.assert_close(cross.share, share, rtol=1e-6, atol=0)  # what edits move
    analyser = NumericsAnalyser()
    analyser.update(cross)
    assert analyser.compute().query("metric == 'row_sum_rows'")["sum"].sum() == 0


def test_a_view_whose_prompt_mass_underflows_to_zero_is_a_zero_view_not_a_row_sum_failure():
    """exp(-110) ~ 1.7e-48 is 0 in float32: the last rows' prompt view holds nothing, a
    zero row. The numerics check counts it as a zero view and does not judge its sum; the
    same zero row outside a view still fails the row-sum check."""
    prompt, n = 4, 6
    scores = torch.zeros(1, 1, n, n)
    scores[..., prompt:, :prompt] = -110.0
    model = CausalAttention()
    raw = model(scores)
    assert (raw[0, 0, prompt:, :prompt] == 0).all()
    with prompt_views(prompt), attnaudit.capture(model) as cap:
        model(scores)
    cross = cap.records["forward:cross"]
    expected = hand_views(raw, prompt)["cross"]  # rows 1.. (steps from the prompt's end) zero
    torch.testing.assert_close(cross.weights.double(), expected, rtol=1e-6, atol=0)
    zero = (expected.sum(-1) == 0)[0, 0]
    assert zero.tolist() == [False, True, True]
    analyser = NumericsAnalyser(tolerance=None)
    analyser.update(cross)
    frame = analyser.compute().set_index("metric")
    assert frame.loc["zero_view_rows", "sum"].sum() == 2
    assert frame.loc["row_sum_rows", "sum"].sum() == 0
    assert frame.loc["row_sum_rows", "n"].sum() == 1  # only the first row is judged
    plain = NumericsAnalyser(tolerance=None)
    plain.update(AttentionRows("plain", None, cross.weights,
                               torch.ones_like(cross.weights, dtype=torch.bool)))
    frame = plain.compute().set_index("metric")
    assert frame.loc["row_sum_rows", "sum"].sum() == 2
    assert frame.loc["zero_view_rows", "sum"].sum() == 0


class TwiceRun(nn.Module):
    """One attention module run twice over the same positions per pass (shared layers)."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = CausalAttention()

    def forward(self, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        first = self.attn(scores)
        return first, self.attn(scores + first)


def test_a_layer_run_twice_in_one_pass_gives_a_second_set_of_views():
    prompt, n = 3, 6
    torch.manual_seed(0)
    scores = torch.randn(2, 2, n, n)
    model = TwiceRun()
    first, second = model(scores)
    with prompt_views(prompt), attnaudit.capture(model) as cap:
        model(scores)
    assert list(cap.records) == ["attn:cross", "attn:self", "attn#2:cross", "attn#2:self"]
    for base, raw in (("attn", first), ("attn#2", second)):
        for kind, expected in hand_views(raw, prompt).items():
            rec = cap.records[f"{base}:{kind}"]
            assert rec.weights.shape[2] == n - prompt + 1  # not twice the rows
            torch.testing.assert_close(rec.weights.double(), expected, rtol=0, atol=1e-6)
    # one pass per block: the next pass (a cached step) continues the same sites
    with prompt_views(prompt), attnaudit.capture(model) as again:
        model(scores)
        with prompt_views(prompt):
            model(scores)
    assert list(again.records) == list(cap.records)
    assert again.records["attn:cross"].weights.shape[2] == 2 * (n - prompt + 1)


transformers = pytest.importorskip("transformers")
from tests.helpers.tiny_hf import tiny_config  # noqa: E402

P, WINDOW, STEPS = 7, 3, 4


def tiny_windowed(name: str = "mistral") -> nn.Module:
    """A tiny Mistral (every layer windowed) or Gemma-2 (every other layer) with a sliding
    window of 3."""
    sizes = dict(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=4,
                 max_position_embeddings=32, sliding_window=WINDOW, attn_implementation="eager")
    torch.manual_seed(0)
    if name == "gemma2":
        config = transformers.Gemma2Config(**sizes, query_pre_attn_scalar=4,
                                           layer_types=["sliding_attention", "full_attention"])
        return transformers.Gemma2ForCausalLM(config).eval()
    return transformers.MistralForCausalLM(transformers.MistralConfig(**sizes)).eval()


@pytest.mark.parametrize("name", ["mistral", "gemma2"])
def test_a_window_of_3_on_a_7_token_prompt_teacher_forced_and_cached(name):
    model = tiny_windowed(name)
    torch.manual_seed(3)
    ids = torch.randint(3, 50, (2, P + STEPS - 1))  # prompt + the steps' inputs
    with torch.no_grad():
        truth = model(input_ids=ids, output_attentions=True).attentions
        with prompt_views(P), attnaudit.capture(model) as forced:
            model(input_ids=ids)
        with attnaudit.capture(model, sites=lambda name: False) as _:
            cache = model(input_ids=ids[:, :P - 1], use_cache=True).past_key_values
        with attnaudit.capture(model) as stepped:
            for step in range(STEPS):
                with prompt_views(P, positions=P + step):
                    cache = model(input_ids=ids[:, P - 1 + step:P + step], use_cache=True,
                                  past_key_values=cache).past_key_values
    layers = [f"model.layers.{i}.self_attn" for i in range(2)]
    assert stepped.records["model.layers.0.self_attn:cross"].calls[-1].weights.shape[-1] == P
    # layer 0 is windowed in both: its last row no longer reaches the prompt
    assert truth[0][0, 0, -1, :P].sum() == 0
    for layer, raw in zip(layers, truth, strict=True):
        for kind, expected in hand_views(raw, P).items():
            got = forced.records[f"{layer}:{kind}"].weights.double()
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
            cached = stepped.records[f"{layer}:{kind}"]
            assert cached.weights.shape == expected.shape  # keys in absolute positions
            torch.testing.assert_close(cached.weights.double(), expected, rtol=0, atol=1e-5)
    mask = stepped.records[f"{layers[0]}:cross"].key_mask
    assert not mask[..., -1, :].any()  # no prompt key in the window of the last step


def test_prophetnet_predict_streams_are_not_cut_into_prompt_views():
    config = transformers.ProphetNetConfig(
        vocab_size=50, hidden_size=16, encoder_ffn_dim=32, decoder_ffn_dim=32,
        num_encoder_layers=1, num_decoder_layers=1, num_encoder_attention_heads=4,
        num_decoder_attention_heads=4, ngram=2, max_position_embeddings=32,
        is_encoder_decoder=False, add_cross_attention=False)
    torch.manual_seed(0)
    model = transformers.ProphetNetForCausalLM(config).eval()
    ids = torch.randint(3, 50, (2, P))
    with torch.no_grad():
        truth = model(input_ids=ids, output_attentions=True)
        with prompt_views(P - 2), attnaudit.capture(model) as cap:
            model(input_ids=ids)
    main = "prophetnet.decoder.layers.0.self_attn"
    assert {name for name in cap.records if name.endswith((":cross", ":self"))
            and "@" not in name} == {f"{main}:cross", f"{main}:self"}
    for kind, expected in hand_views(truth.attentions[0], P - 2).items():
        torch.testing.assert_close(cap.records[f"{main}:{kind}"].weights.double(), expected,
                                   rtol=0, atol=1e-5)
    streams = [r for name, r in cap.records.items() if name.startswith(f"{main}@")]
    assert len(streams) == 1  # recorded whole: every stream's rows over all 2T keys
    stream = streams[0]
    ngram = truth.ngram_attentions[0]  # (B, ngram, H, T, 2T)
    expected = ngram.permute(0, 2, 1, 3, 4).reshape(2, 4, -1, 2 * P)
    torch.testing.assert_close(stream.weights, expected, rtol=0, atol=1e-5)


def test_hrm_text_cycles_give_one_set_of_views_per_run_equal_to_eager():
    config = tiny_config(transformers.HrmTextConfig)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.HrmTextForCausalLM(config).eval()
    ids = torch.randint(3, 60, (2, P))
    order: list[tuple[str, int]] = []
    with torch.no_grad():
        truth = model(input_ids=ids, output_attentions=True).attentions
        with attnaudit.capture(model, edit=lambda site, w, m: order.append(
                (site.name.split(":")[0], site.call))):
            model(input_ids=ids)
        with prompt_views(P - 2), attnaudit.capture(model) as cap:
            model(input_ids=ids)
    assert len(order) == len(truth) > len({name for name, _ in order})  # layers run again
    for (base, call), raw in zip(order, truth, strict=True):
        name = base if call == 0 else f"{base}#{call + 1}"
        for kind, expected in hand_views(raw, P - 2).items():
            rec = cap.records[f"{name}:{kind}"]
            assert rec.weights.shape[2] == 3
            torch.testing.assert_close(rec.weights.double(), expected, rtol=0, atol=1e-5)


def test_views_of_a_sliding_window_step_write_back_what_an_edit_returns():
    """An edit returning the view unchanged (a new tensor, so it is written back through
    the unseen keys' padding) leaves every cached step's logits as they were; halving the
    cross view's weights changes them."""
    model = tiny_windowed()
    torch.manual_seed(4)
    ids = torch.randint(3, 50, (2, P + STEPS - 1))

    def steps(edit) -> torch.Tensor:
        logits = []
        with torch.no_grad():
            cache = model(input_ids=ids[:, :P - 1], use_cache=True).past_key_values
            with attnaudit.capture(model, sites=lambda name: name.endswith(":cross"),
                                   edit=edit):
                for step in range(STEPS):
                    with prompt_views(P, positions=P + step):
                        out = model(input_ids=ids[:, P - 1 + step:P + step], use_cache=True,
                                    past_key_values=cache)
                    cache = out.past_key_values
                    logits.append(out.logits[:, -1])
        return torch.stack(logits, 1)

    plain = steps(None)
    torch.testing.assert_close(steps(lambda site, w, m: w.clone()), plain, rtol=0, atol=1e-6)
    assert not torch.allclose(steps(lambda site, w, m: w / 2), plain, atol=1e-4)
