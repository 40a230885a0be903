"""Every decoder-only LM in transformers' causal-LM auto-mapping, through ``from_hf``, capture,
the gate and the intervention runner.

For each architecture in ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` a tiny seeded random-init
checkpoint and a word-level tokenizer are saved to a tmp folder
(``tests/helpers/tiny_causal.py``; nothing is downloaded) and loaded with
``attnaudit.from_hf``. Ground truth is the same folder loaded a second time with
``attn_implementation="eager"`` and run through its own ``generate()`` on the same
left-padded prompts with ``output_attentions`` and ``output_logits``: the model's own
position ids, masks and cache, nothing from attnaudit. Then, per architecture:

- **decoding parity**: ``target.greedy`` equals the eager ``generate()`` continuation, and
  the teacher-forced logits (one pass over prompt + continuation, as every audit runs it)
  equal the raw per-step logits of ``generate()`` (before its logits processors) within
  1e-4;
- **capture**: in ``generate()`` each cached step's captured weights equal the eager step's
  (real query rows of the prefill), and the teacher-forced prompt views equal the eager
  step rows cut to the prompt (``:cross``) and to the prompt's last token + prefix
  (``:self``), each renormalised and scaled to what the row's keys hold (1 less a sink's
  weight, which ``rec.sink`` must equal), within 1e-5; rows whose view mass underflows in
  eager's float32 are only checked finite. Eager's maps are matched to records by the order
  the modules ran (torch forward hooks): a layer run several times per pass gives one
  record per run (``#n``) in the views, and its calls in order in ``generate()``;
- **gate**: ``audit(..., checks_only=True).gate()`` is healthy (``attnaudit check`` exits 0);
- **interventions**: the reference run says how edited items run (one cached step, or the
  prefix re-run and why: never silently), and the uniform intervention on every counted row
  gives the same output change on that path as on the prefix re-run within 1e-5.

Architectures whose attention is not captured as it is yet are marked xfail with the class
of break (:data:`XFAIL`); only those that cannot be audited this way are skipped, with the
reason. The last test prints the counts (``pytest -s``).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import torch

import attnaudit
from attnaudit.interventions.ablation import uniform_test
from attnaudit.interventions.reference_run import reference

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast  # noqa: E402
from transformers.models.auto import modeling_auto  # noqa: E402
from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # noqa: E402

from tests.helpers.tiny_causal import tiny_causal_config  # noqa: E402
from tests.helpers.tiny_hf import save_checkpoint  # noqa: E402

TOL = 1e-5
LOGIT_TOL = 1e-4
NEW_TOKENS = 3
ROWS = 4  # intervention rows per architecture: step 0 and later steps of the first prompts
PROMPT_WORDS = (5, 2, 4)  # three lengths: two rows are left-padded
ARCHITECTURES = dict(modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
COVERED_FLOOR = 167  # raise as the xfail classes below are fixed
MAX_SKIPPED = 16

# Skipped, with the reason: what from_hf's text prompts cannot audit.
NO_ATTENTION = "no attention at all (a recurrent / state-space model): nothing to capture"
TEXT_HALF = ("cannot be loaded from its folder: its causal-LM class takes the text half of "
             "a vision-language config, which AutoModelForCausalLM does not map")
SKIP: dict[str, str] = {
    "mamba": NO_ATTENTION, "mamba2": NO_ATTENTION, "falcon_mamba": NO_ATTENTION,
    "rwkv": NO_ATTENTION, "xlstm": NO_ATTENTION,
    "musicgen": "audio-only: its decoder reads audio codebooks, not text tokens",
    "musicgen_melody": "audio-only: its decoder reads audio codebooks, not text tokens",
    "mllama": TEXT_HALF, "emu3": TEXT_HALF,
    "gemma4_assistant": "cannot be built from a config: its default config fails its own "
                        "validation (hidden_size_per_layer_input must be 0)",
    "gemma4_unified_assistant": "cannot run from a config alone: a drafter that reads the "
                                "main model's shared key/value states",
}

# Known breaks, by class: the architecture runs and is expected to fail until its class is
# fixed.
# Target-side (attnaudit/targets/hf/causal.py):
PROMPT_POSITIONS = ("target: CPM-Ant prepends its own learned prompt positions to every "
                    "sequence and takes padding from the ids (id 0; its attention_mask is a "
                    "dummy): the prompt views' keys and the left padding do not line up")
# Not yet classified to a side: the model's one teacher-forced pass and its own generate()
# steps differ, so neither parity nor the views can hold.
INDEXER = ("parity: a sparse-attention indexer picks other top-k keys in one pass than in "
           "generate()'s cached steps")
SCAN = ("parity: state-space layers give other logits in one pass than step by step "
        "(> 1e-4)")
PASS_VS_STEPS = ("parity: the model's own generate() ignores left padding where its one pass "
                 "does not (ProphetNet's cached steps give every row one position, past "
                 "length + 1; Reformer's generate() drops the attention mask)")
COMPOUNDED = ("parity: layers run six times per pass compound rounding: eager's own one pass "
              "and its cached steps differ by up to 2e-5 in later runs' rows (> 1e-5)")
NOT_CAUSAL = ("parity: generate() is not causal decoding of the prompt (XLM appends a mask "
              "token, XLNet is a permutation LM)")
OWN_GENERATE = ("parity: the model's own cached generate() without an image widens the mask "
                "over image tokens it never cached (GIT)")
# Capture-side (attnaudit/capturing/): sites eager's per-layer maps do not hold.
DEPTH = ("capture: block attention residuals (attention over the layer blocks' outputs, not "
         "over tokens) are captured as attention sites; eager's output_attentions leaves them "
         "out")
NO_GENERATE = ("parity: the model's own generate() does not run: its cache is sized by "
               "config.num_hidden_layers, which BLT's config (four sub-models) lacks")
# The tiny config does not build yet (tests/helpers/tiny_causal.py): a harness gap.
BUILD = "harness: no tiny config of this class builds yet"
XFAIL: dict[str, str] = {
    "cpmant": PROMPT_POSITIONS,
    **dict.fromkeys(["deepseek_v32", "glm_moe_dsa", "dots3_note_text", "hy_v4"], INDEXER),
    "nemotron_h": SCAN, "zamba2": SCAN, "prophetnet": PASS_VS_STEPS,
    "reformer": PASS_VS_STEPS, "hrm_text": COMPOUNDED, "xlm": NOT_CAUSAL,
    "xlnet": NOT_CAUSAL, "git": OWN_GENERATE,
    **dict.fromkeys(["inkling2_loop_text", "inkling2_text"], DEPTH),
    "blt": NO_GENERATE, "dots3_note": BUILD,
}

OUTCOMES: dict[str, str] = {}  # arch -> "covered" / "skipped: ..." / "xfail: ..."
_PASSED: dict[str, set[str]] = {}
_RAN: set[str] = set()
TESTS = {"parity", "capture", "gate", "interventions"}


@dataclass
class Built:
    arch: str
    target: attnaudit.Seq2SeqTarget
    batch: Any
    truth: Any  # the eager model's generate() output (sequences, attentions, logits)
    prompt: int  # P, the padded prompt length


def skip(arch: str, reason: str) -> None:
    OUTCOMES[arch] = f"skipped: {reason}"
    pytest.skip(f"{arch}: {reason}")


def _param(arch: str) -> Any:
    """An architecture, marked xfail with its class of break when that is known."""
    # a config that does not build is not built again every run
    marks = [pytest.mark.xfail(reason=XFAIL[arch], strict=False,
                               run=XFAIL[arch] != BUILD)] if arch in XFAIL else []
    return pytest.param(arch, marks=marks, id=arch)


@pytest.fixture(scope="module", params=[_param(arch) for arch in sorted(ARCHITECTURES)])
def built(request, tmp_path_factory) -> Built:
    arch = request.param
    _RAN.add(arch)
    if arch in SKIP:
        skip(arch, SKIP[arch])
    folder = tmp_path_factory.mktemp(arch)
    model_cls = getattr(transformers, ARCHITECTURES[arch])
    try:
        config = tiny_causal_config(CONFIG_MAPPING[arch], model_cls, arch)
        words = save_checkpoint(model_cls, config, folder, eos_after=False)
    except ImportError as exc:
        skip(arch, "needs a package that is not installed: "
                   + str(exc).strip().splitlines()[0])
    prompts = [" ".join(words[4 * i : 4 * i + n]) for i, n in enumerate(PROMPT_WORDS)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' notes on tiny random checkpoints
        # the saved word-level tokenizer itself: some model types' AutoTokenizer classes
        # rebuild a byte-level pipeline around its vocabulary
        tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
        target = attnaudit.from_hf(folder, prompts, tokenizer=tokenizer,
                                   max_new_tokens=NEW_TOKENS, decoding="greedy")
        truth_model = AutoModelForCausalLM.from_pretrained(
            folder, local_files_only=True, attn_implementation="eager").eval()
    batch = next(target.iter_batches())
    assert not batch.source_mask[:, 0].all(), "some prompt must be left-padded"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        truth = generate(truth_model, target, batch, output_attentions=True,
                         output_logits=True, return_dict_in_generate=True)
    return Built(arch, target, batch, truth, batch.source_ids.shape[1])


def generate(model: Any, target: Any, batch: Any, **extra: Any) -> Any:
    """``model``'s own greedy ``generate()`` on the left-padded batch, padded with the
    target's pad id."""
    pad = int(batch.source_ids[~batch.source_mask][0])  # the id the target pads with
    return model.generate(input_ids=batch.source_ids, attention_mask=batch.source_mask.long(),
                          do_sample=False, num_beams=1, max_new_tokens=NEW_TOKENS,
                          pad_token_id=pad, eos_token_id=target.eos_id, **extra)


def _passed(arch: str, test: str) -> None:
    _PASSED.setdefault(arch, set()).add(test)
    if _PASSED[arch] == TESTS and arch not in XFAIL:
        OUTCOMES[arch] = "covered"


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str,
                 tol: float = TOL) -> None:
    shapes = f"{tuple(actual.shape)} vs {tuple(expected.shape)}"
    assert actual.shape == expected.shape, f"{what}: {shapes}"
    diff = (actual.detach().double() - expected.detach().double()).abs().max().item()
    assert diff <= tol, f"{what}: max abs diff {diff:.3g} > {tol}"


def eager_layers(step_attentions: tuple[Any, ...], config: Any) -> list[torch.Tensor]:
    """One generate() step's attention maps (B, H, q, k), in the order the layers ran: layers
    without one left out, and linear-attention layers (``config.layer_types``), whose entry
    is their key-value state (MiniMax's lightning attention), not weights."""
    types = getattr(config, "layer_types", None)
    if not isinstance(types, (list, tuple)) or len(types) != len(step_attentions):
        types = [None] * len(step_attentions)
    return [a for a, kind in zip(step_attentions, types, strict=True)
            if isinstance(a, torch.Tensor) and "linear" not in str(kind)]


def module_run(rec: Any) -> tuple[str, int]:
    """A record's module path and which of the module's runs per pass it holds: 1 unless
    its name says ``#n`` (``<site>[#n]:kind``)."""
    _, _, run = rec.name.split(":", 1)[0].partition("#")
    return rec.site.module, int(run or 1)


@contextmanager
def module_calls(model: torch.nn.Module) -> Iterator[list[list[str]]]:
    """Per forward of ``model``, the paths of its submodules in the order they ran (torch's
    own forward pre-hooks: how eager's per-layer attentions line up with the modules when a
    layer runs more than once per pass)."""
    passes: list[list[str]] = []
    handles = [model.register_forward_pre_hook(lambda *_: passes.append([]))]
    handles += [module.register_forward_pre_hook(
                    lambda *_, path=path: passes[-1].append(path) if passes else None)
                for path, module in model.named_modules() if path]
    try:
        yield passes
    finally:
        for handle in handles:
            handle.remove()


def eager_by_module(truth: Any, config: Any, passes: list[list[str]],
                    modules: set[str]) -> dict[str, list[list[torch.Tensor]]]:
    """module -> step -> the maps eager returned for the module's runs in that step, by the
    order the record ``modules`` ran in each generate() step."""
    out: dict[str, list[list[torch.Tensor]]] = {m: [] for m in modules}
    for step, ran in zip(truth.attentions, passes, strict=True):
        maps, order = eager_layers(step, config), [p for p in ran if p in modules]
        assert len(order) == len(maps), f"modules run {order} vs {len(maps)} eager maps"
        for entries in out.values():
            entries.append([])
        for path, weights in zip(order, maps, strict=True):
            out[path][-1].append(weights)
    return out


def test_decoding_parity(built: Built) -> None:
    target, batch, truth = built.target, built.batch, built.truth
    emitted = target.greedy(batch)
    assert torch.equal(emitted, truth.sequences[:, built.prompt:]), "greedy vs generate()"
    with torch.no_grad():
        logits = target.teacher_forced(batch, emitted)
    raw = torch.stack(truth.logits, dim=1)  # (B, T, V) before the logits processors
    scale = max(1.0, raw.abs().max().item())
    steps = target.step_mask(emitted)
    assert_close(logits[steps], raw[steps], "teacher-forced vs generate() logits",
                 LOGIT_TOL * scale)
    _passed(built.arch, "parity")


def test_capture_equals_eager(built: Built) -> None:
    target, batch, truth, prompt = built.target, built.batch, built.truth, built.prompt
    real = batch.source_mask
    with torch.no_grad():
        # the model's own generate(), as a user captures it (target.greedy decodes under
        # prompt views, which the teacher-forced capture below checks)
        with attnaudit.capture(target.model) as steps, module_calls(target.model) as passes, \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            emitted = generate(target.model, target, batch)[:, prompt:]
        with attnaudit.capture(target.model) as views:
            target.teacher_forced(batch, emitted)
    n_steps = emitted.shape[1]
    assert len(passes) == n_steps == len(truth.attentions)
    records = list(steps.records.values())
    assert records, "no site captured"
    # a module's further softmax calls in one run (``@m``: DiffLlama's second call shares
    # its query and keys) are compared with the one map eager returns for that run
    eager = eager_by_module(truth, target.model.config, passes,
                            {module_run(r)[0] for r in records})
    lead = leading_keys(truth, target.model.config, prompt)
    for rec in records:
        expected = [(t, w) for t, runs in enumerate(eager[module_run(rec)[0]])
                    for w in runs]
        assert len(rec.calls) == len(expected), f"{rec.name}: {len(rec.calls)} calls"
        for call, (t, weights) in zip(rec.calls, expected, strict=True):
            if t > 0:
                assert_close(call.weights, weights, f"{rec.name} step {t}")
                continue
            got = call.weights
            if lead and weights.shape[-1] == got.shape[-1] - lead:
                got = got[:, :, lead:, lead:]  # eager's prefill map leaves the lead out
            for row in range(len(real)):  # real query rows only: padded ones are a convention
                queries = real[row].nonzero().squeeze(1)
                assert_close(got[row][:, queries], weights[row][:, queries],
                             f"{rec.name} prefill row {row}")
    runs = {(m, r + 1) for m, per_step in eager.items() for r in range(len(per_step[0]))}
    for kind in ("cross", "self"):
        found = [r for r in views.records.values() if r.kind == kind]
        assert {module_run(r) for r in found} == runs, f"{kind}: {[r.name for r in found]}"
        for rec in found:
            module, run = module_run(rec)
            # (B, H, P+t): the sequence's keys, the row's last (a lead's weight is a sink's)
            rows = [eager[module][t][run - 1][:, :, -1, -(prompt + t):] for t in range(n_steps)]
            assert_view(rec, rows, kind, prompt)
    _passed(built.arch, "capture")


def leading_keys(truth: Any, config: Any, prompt: int) -> int:
    """Keys of the model's own before the sequence's (CPM-Ant's learned prompt positions),
    as eager's last cached step shows them: its key count less the P + t positions of the
    sequence (0 for a model that prepends nothing, or when generate() ran one step)."""
    t = len(truth.attentions) - 1
    keys = eager_layers(truth.attentions[t], config)[0].shape[-1]
    return max(keys - (prompt + t), 0) if t else 0


def assert_view(rec: Any, rows: list[torch.Tensor], kind: str, prompt: int) -> None:
    """A teacher-forced view record (B, H, T, n) against eager's query row of each step t
    (B, H, P + t): cut to the view's keys, renormalised, scaled to what the row's keys hold
    (1 less the weight on sink columns, which eager leaves out)."""
    expected = torch.zeros_like(rec.weights)
    # eager's float32 rows define a view only where the view's mass is a normal float:
    # below, its weights have underflowed (to 0, or to a few subnormal steps) and
    # renormalising them has no precision left to compare with
    defined = torch.zeros(rec.weights.shape[:3], dtype=torch.bool)
    for t, row in enumerate(rows):
        part = row[..., :prompt] if kind == "cross" else row[..., prompt - 1 :]
        mass, total = part.sum(-1, keepdim=True), row.sum(-1, keepdim=True)
        expected[:, :, t, : part.shape[-1]] = part / mass * total
        defined[:, :, t] = mass.squeeze(-1) >= torch.finfo(mass.dtype).tiny
    assert_close(rec.weights[defined], expected[defined], f"{rec.name} ({kind} view)")
    if rec.sink is not None:
        eager_sink = torch.stack([1 - row.double().sum(-1) for row in rows], -1).unsqueeze(-1)
        assert_close(rec.sink, eager_sink, f"{rec.name} ({kind} view's sink)")
    assert torch.isfinite(rec.weights).all(), f"{rec.name}: a view is not finite"


def test_gate_is_healthy(built: Built) -> None:
    gate = attnaudit.audit(built.target, checks_only=True, progress=False).gate()
    assert gate.status == 0, gate.summary()
    _passed(built.arch, "gate")


def test_interventions_on_the_cached_step_or_the_rerun(built: Built) -> None:
    target, batch = built.target, built.batch
    ref = reference(target, batch)
    # which path ran is said, never silent: a cached step, or the re-run and why
    assert (ref.states is None) == (ref.cache_note is not None), ref.cache_note
    rows = ref.rows()
    assert len(rows) >= 1
    rows = rows.select(torch.arange(min(len(rows), ROWS)))  # the first rows: every step kind
    got = uniform_test(target, ref, rows)
    if ref.states is not None:
        again = uniform_test(target, reference(target, batch, incremental=False), rows)
        assert (got["uniform_tvd"] - again["uniform_tvd"]).abs().max() <= TOL
    assert got["uniform_tvd"].notna().all()
    OUTCOMES.setdefault(f"{built.arch}/path", "cached" if ref.states is not None
                        else f"re-run ({ref.cache_note})")
    _passed(built.arch, "interventions")


def test_summary_covered_architectures() -> None:
    """Runs last (pytest keeps file order): how many architectures were covered."""
    unbuilt = {arch for arch, reason in XFAIL.items() if reason == BUILD}  # not run
    missing = sorted(set(ARCHITECTURES) - _RAN - unbuilt)
    if missing:
        pytest.skip(f"not every architecture ran here (missing {len(missing)})")
    covered = sorted(a for a in ARCHITECTURES if OUTCOMES.get(a) == "covered")
    skipped = {a: OUTCOMES[a] for a in ARCHITECTURES if OUTCOMES.get(a, "").startswith("skip")}
    xfailed = {a: XFAIL[a] for a in ARCHITECTURES if a in XFAIL}
    failed = sorted(set(ARCHITECTURES) - set(covered) - set(skipped) - set(xfailed))
    rerun = sorted(a for a in covered if OUTCOMES.get(f"{a}/path", "").startswith("re-run"))
    by_class: dict[str, int] = {}
    for reason in xfailed.values():
        by_class[reason] = by_class.get(reason, 0) + 1
    lines = [f"HF causal-LM architectures covered: {len(covered)} of {len(ARCHITECTURES)} "
             f"({len(rerun)} by the prefix re-run); xfail: {len(xfailed)}; skipped: "
             f"{len(skipped)}; failing: {len(failed)} {failed}"]
    lines += [f"  xfail {n}: {reason}" for reason, n in sorted(by_class.items())]
    lines += [f"  {a}: {o}" for a, o in sorted(skipped.items())]
    lines += [f"  {a}: {OUTCOMES[a + '/path']}" for a in rerun]
    print("\n" + "\n".join(lines))
    assert len(covered) >= COVERED_FLOOR, "\n".join(lines)
    assert len(skipped) <= MAX_SKIPPED, "\n".join(lines)
