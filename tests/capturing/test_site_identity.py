"""Which site a call belongs to and what kind it is, however the model's code is written;
and capture through ``torch.jit.trace`` and ``torch.compile``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import attnaudit
from tests.capturing.test_layouts import (
    HEADS,
    D,
    FoldedAttention,
    cross_inputs,
    folded_reference,
    uniform_edit,
)


class PermutingWrapper(nn.Module):
    """Self-attention through ``nn.MultiheadAttention`` on separately permuted copies."""

    def __init__(self) -> None:
        super().__init__()
        self.att = nn.MultiheadAttention(D, HEADS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x (B, T, D)
        out, _ = self.att(x.permute(1, 0, 2), x.permute(1, 0, 2), x.permute(1, 0, 2))
        return out.permute(1, 0, 2)


class IncrementalSelfAttention(nn.Module):
    """Self-attention decoded one step at a time: the keys are a growing cache whose last
    position is the query."""

    def __init__(self) -> None:
        super().__init__()
        self.att = nn.MultiheadAttention(D, HEADS, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        steps = [self.att(x[:, t:t + 1], x[:, : t + 1], x[:, : t + 1])[0]
                 for t in range(x.shape[1])]
        return torch.cat(steps, 1)


class EncoderDecoderMha(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(D, HEADS, batch_first=True)
        self.memory_reader = nn.MultiheadAttention(D, HEADS, batch_first=True)

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        x = self.self_attn(x, x, x)[0]
        return self.memory_reader(x, memory, memory)[0]


@pytest.mark.parametrize("model", [PermutingWrapper, IncrementalSelfAttention])
def test_self_attention_on_copies_of_the_same_data_is_self(model):
    torch.manual_seed(0)
    with torch.no_grad(), attnaudit.capture(model().eval()) as cap:
        cap.model(torch.randn(2, 5, D))
    assert cap.sites == ["att:self"]


def test_mha_cross_attention_is_cross_whatever_its_name():
    torch.manual_seed(0)
    with torch.no_grad(), attnaudit.capture(EncoderDecoderMha().eval()) as cap:
        cap.model(torch.randn(2, 5, D), torch.randn(2, 7, D))
    assert cap.sites == ["self_attn:self", "memory_reader:cross"]


CROSS_NAMES = ("context_attn", "src_trg_att", "enc_attention", "encdec_attention", "inter_attn",
               "src_attn")


def test_cross_attention_module_names_used_by_toolkits_are_cross():
    class Decoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            for name in CROSS_NAMES:
                self.add_module(name, FoldedAttention())

        def forward(self, x, memory, allowed):
            for name in CROSS_NAMES:
                x = getattr(self, name)(x, memory, allowed)
            return x

    torch.manual_seed(0)
    with torch.no_grad(), attnaudit.capture(Decoder()) as cap:
        cap.model(*cross_inputs())
    assert cap.sites == [f"{name}:cross" for name in CROSS_NAMES]


class OddlyNamedSelf(nn.Module):
    """Attention in a method whose first parameter is not called ``self``."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(D, D)

    def attend(s, query, keys):  # the first parameter is not called self, on purpose
        return torch.softmax(s.proj(query) @ keys.transpose(-1, -2), dim=-1)


def free_attend(model, query, keys):
    """Attention in a free function, called from the user's own loop with the model."""
    return torch.softmax(model.proj(query) @ keys.transpose(-1, -2), dim=-1)


@pytest.mark.parametrize("how", ["odd method", "free function"])
def test_attention_outside_self_methods_is_found(how):
    torch.manual_seed(0)
    model = OddlyNamedSelf()
    query, keys = torch.randn(2, 3, D), torch.randn(2, 4, D)
    with torch.no_grad(), attnaudit.capture(model) as cap:
        for _ in range(2):  # the user's own loop
            out = model.attend(query, keys) if how == "odd method" else free_attend(model, query,
                                                                                    keys)
    expected = torch.softmax(model.proj(query) @ keys.transpose(-1, -2), dim=-1)
    name = "attend" if how == "odd method" else "free_attend"
    assert cap.sites == [name]
    rec = cap.records[name]
    assert rec.weights.shape == (2, 1, 6, 4)
    assert (rec.calls[1].weights[:, 0] - expected).abs().max().item() <= 1e-6
    assert torch.equal(out, expected)


def test_free_function_on_a_submodule_names_that_module():
    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = OddlyNamedSelf()

        def forward(self, query, keys):
            return free_attend(self.inner, query, keys)

    with torch.no_grad(), attnaudit.capture(Outer()) as cap:
        cap.model(torch.randn(2, 3, D), torch.randn(2, 4, D))
    assert cap.sites == ["inner"]


def test_kinds_must_be_self_or_cross():
    with pytest.raises(ValueError, match="'self' or 'cross'"):
        attnaudit.capture(FoldedAttention(), kinds={"forward": "sideways"})


@pytest.mark.parametrize("bad", [123, [1, 2]])
def test_sites_of_the_wrong_type_are_refused(bad):
    with pytest.raises(TypeError, match="sites must be"):
        attnaudit.capture(FoldedAttention(), sites=bad)


def test_a_capture_is_used_once():
    module = FoldedAttention()
    cap = attnaudit.capture(module)
    with torch.no_grad(), cap:
        module(*cross_inputs())
    with pytest.raises(attnaudit.CaptureError, match="used once"), cap:
        pass
    assert len(cap.records["forward"].calls) == 1


def plain_output(module: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return module(*cross_inputs())


@pytest.mark.parametrize("with_edit", [False, True])
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::torch.jit.TracerWarning")
def test_tracing_inside_a_capture_is_refused_and_bakes_nothing_in(with_edit):
    torch.manual_seed(0)
    module = FoldedAttention()
    before = plain_output(module)
    edit = uniform_edit if with_edit else None
    with pytest.raises(attnaudit.CaptureError, match=r"torch\.jit\.trace"), torch.no_grad(), \
            attnaudit.capture(module, edit=edit):
        torch.jit.trace(module, cross_inputs())
    assert torch.equal(plain_output(module), before)
    traced = torch.jit.trace(module, cross_inputs())  # outside: the plain model is traced
    assert torch.equal(traced(*cross_inputs()), before)


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::torch.jit.TracerWarning")
def test_a_traced_model_is_refused_with_a_clear_error():
    torch.manual_seed(0)
    traced = torch.jit.trace(FoldedAttention(), cross_inputs())
    with pytest.raises(attnaudit.CaptureError, match="TorchScript"):
        attnaudit.capture(traced)


def test_a_compiled_model_is_captured_eagerly_and_left_compiled():
    torch.manual_seed(0)
    module = FoldedAttention()
    compiled = torch.compile(module, backend="eager")
    x, memory, allowed = cross_inputs()
    with torch.no_grad():
        before = compiled(x, memory, allowed)  # compiled before the capture
        with attnaudit.capture(compiled, kinds={"forward": "cross"}) as cap:
            compiled(x, memory, allowed)
        with attnaudit.capture(compiled, edit=uniform_edit):
            edited = compiled(x, memory, allowed)
        after = compiled(x, memory, allowed)
        ref_w, _ = folded_reference(module, x, memory, allowed)
        _, ref_uniform = folded_reference(module, x, memory, allowed,
                                          uniform_heads=range(HEADS))
    assert cap.sites == ["forward:cross"]  # no _orig_mod in names; the override applied
    assert (cap.records["forward:cross"].weights - ref_w).abs().max().item() <= 1e-5
    assert (edited - ref_uniform).abs().max().item() <= 1e-5
    assert torch.equal(after, before)  # no edit survives the context


def test_compiled_code_runs_eagerly_while_a_capture_is_active():
    """Inside a capture the compiler's stance is force_eager (no graph is built, nothing is
    baked in with an edit); afterwards the stance is what it was."""
    from torch._dynamo import eval_frame

    torch.manual_seed(0)
    module = FoldedAttention()
    compiled = torch.compile(module, backend="eager")
    seen = []

    def spy(site, weights, key_mask):
        seen.append(eval_frame._stance.stance)
        return None

    before = eval_frame._stance.stance
    with torch.no_grad(), attnaudit.capture(compiled, edit=spy):
        compiled(*cross_inputs())
    assert seen == ["force_eager"]
    assert eval_frame._stance.stance == before


def test_two_attention_lines_in_one_method_are_numbered_by_first_call():
    class TwoStreams(nn.Module):
        def forward(self, main, extra):
            second = torch.softmax(extra, -1)  # called first, so it keeps the plain name
            first = torch.softmax(main, -1)
            return first, second

    with torch.no_grad(), attnaudit.capture(TwoStreams()) as cap:
        cap.model(torch.randn(2, 3, 4), torch.randn(2, 3, 5))
    assert cap.sites == ["forward", "forward@2"]
    assert cap.records["forward@2"].weights.shape[-1] == 4


@pytest.mark.parametrize(("bad", "message"), [
    (lambda w: w > 0.1, "bool"),
    (lambda w: (w * 10).long(), "int64"),
    (lambda w: w * float("nan"), "NaN, inf or negative"),
    (lambda w: w - 0.5, "NaN, inf or negative"),
])
def test_edits_that_are_no_distribution_are_refused(bad, message):
    module = FoldedAttention()
    with pytest.raises(attnaudit.EditError, match=message), torch.no_grad(), \
            attnaudit.capture(module, edit=lambda site, w, m: bad(w)):
        module(*cross_inputs())


def test_invalid_edits_pass_when_asked_for():
    module = FoldedAttention()
    with torch.no_grad(), attnaudit.capture(module, edit=lambda s, w, m: w - 0.5,
                                            allow_invalid=True):
        out = module(*cross_inputs())
    assert torch.isfinite(out).all()


def test_tap_arguments_are_checked():
    class Tapping(nn.Module):
        def forward(self, x):
            return attnaudit.tap("w", [0.5, 0.5])

    with pytest.raises(TypeError, match="weights tensor"), attnaudit.capture(Tapping()):
        Tapping()(torch.ones(1))
