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
  gives the same output change on that path as on the prefix re-run within 1e-5;
- **contributions**: the quick report's contribution suite runs on the batch without an
  exception, and each of its measures is either computed (finite maps) or says why not, in
  words (a hybrid layer whose attention is no residual block: ALTI names the site).

Architectures whose attention is not captured as it is yet are marked xfail with the class
of break (:data:`XFAIL`); only those that cannot be audited this way are skipped, with the
reason. The last test prints the counts (``pytest -s``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

import attnaudit
from attnaudit.auditing.contribution_suite import (
    CONTRIBUTION_MEASURES,
    ZEROING,
    add_contribution_parts,
)
from attnaudit.interventions.ablation import uniform_test
from attnaudit.interventions.reference_run import reference

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast  # noqa: E402
from transformers.models.auto import modeling_auto  # noqa: E402
from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # noqa: E402
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING  # noqa: E402

from tests.helpers.eager_truth import (  # noqa: E402
    LOGIT_TOL,
    TOL,
    OwnPass,
    eager_by_module,
    eager_view,
    leading_keys,
    module_calls,
    own_pass,
)
from tests.helpers.tiny_causal import tiny_causal_config  # noqa: E402
from tests.helpers.tiny_hf import save_checkpoint  # noqa: E402

NEW_TOKENS = 3
ROWS = 4  # intervention rows per architecture: step 0 and later steps of the first prompts
PROMPT_WORDS = (5, 2, 4)  # three lengths: two rows are left-padded
ARCHITECTURES = dict(modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
COVERED_FLOOR = 180  # raise as the xfail classes below are fixed
MAX_SKIPPED = 10

# Skipped, with the reason: what from_hf's text prompts cannot audit.
NO_ATTENTION = "no attention at all (a recurrent / state-space model): nothing to capture"
DRAFTER = ("cannot run from a config alone: a drafter whose forward ignores input_ids and "
           "reads the main model's hidden states and shared key/value states")
SKIP: dict[str, str] = {
    "mamba": NO_ATTENTION, "mamba2": NO_ATTENTION, "falcon_mamba": NO_ATTENTION,
    "rwkv": NO_ATTENTION, "xlstm": NO_ATTENTION,
    "musicgen": "audio-only: its decoder reads audio codebooks, not text tokens",
    "musicgen_melody": "audio-only: its decoder reads audio codebooks, not text tokens",
    **dict.fromkeys(["gemma4_assistant", "gemma4_unified_assistant"], DRAFTER),
}

# Known breaks, by class: the architecture runs and is expected to fail until its class is
# fixed.
# Views: the prompt views are not the attention behind the model's predictions.
PREDICT_STREAM = ("views: ProphetNet predicts from its first predict (n-gram) stream, whose "
                  "attention capture records but does not cut into prompt views (they show "
                  "the main stream); its cached steps drop the attention mask, and "
                  "transformers' predict-stream relative positions are read across positions "
                  "in a multi-token pass")
# Parity: the model's own generate() is not causal decoding of its left-padded prompt as
# its own one pass computes it.
NO_MASK = "parity: Reformer's generate() drops the attention mask of a left-padded prompt"
NOT_CAUSAL = ("parity: generate() is not causal decoding of the prompt (XLM appends a mask "
              "token, XLNet is a permutation LM)")
OWN_GENERATE = ("parity: the model's own cached generate() without an image widens the mask "
                "over image tokens it never cached (GIT)")
NO_GENERATE = ("parity: the model's own generate() does not run: its cache is sized by "
               "config.num_hidden_layers, which BLT's config (four sub-models) lacks")
XFAIL: dict[str, str] = {
    "prophetnet": PREDICT_STREAM, "reformer": NO_MASK,
    "xlm": NOT_CAUSAL, "xlnet": NOT_CAUSAL, "git": OWN_GENERATE, "blt": NO_GENERATE,
}

OUTCOMES: dict[str, str] = {}  # arch -> "covered" / "skipped: ..." / "xfail: ..."
_PASSED: dict[str, set[str]] = {}
_RAN: set[str] = set()
TESTS = {"parity", "capture", "gate", "interventions", "contributions"}


@dataclass
class Built:
    arch: str
    target: attnaudit.Seq2SeqTarget
    batch: Any
    truth: Any  # the eager model's generate() output (sequences, attentions, logits)
    prompt: int  # P, the padded prompt length
    own: OwnPass | None  # set where the model's one pass is not its generate() steps
    ref: Any = None  # the batch's reference run, once the interventions test made it


def skip(arch: str, reason: str) -> None:
    OUTCOMES[arch] = f"skipped: {reason}"
    pytest.skip(f"{arch}: {reason}")


def _param(arch: str) -> Any:
    """An architecture, marked xfail with its class of break when that is known."""
    marks = [pytest.mark.xfail(reason=XFAIL[arch], strict=False)] if arch in XFAIL else []
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
        # a causal-LM class that takes the text half of a vision-language config (Mllama,
        # Emu3) is not what AutoModelForCausalLM maps that config to: it is loaded with its
        # own class, as a user holding one passes it to from_hf
        mapped = type(config) in MODEL_FOR_CAUSAL_LM_MAPPING
        loader = AutoModelForCausalLM if mapped else model_cls
        model = (folder if mapped
                 else loader.from_pretrained(folder, local_files_only=True).eval())
        target = attnaudit.from_hf(model, prompts, tokenizer=tokenizer,
                                   max_new_tokens=NEW_TOKENS, decoding="greedy")
        truth_model = loader.from_pretrained(
            folder, local_files_only=True, attn_implementation="eager").eval()
    batch = next(target.iter_batches())
    assert not batch.source_mask[:, 0].all(), "some prompt must be left-padded"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        truth = generate(truth_model, target, batch, output_attentions=True,
                         output_logits=True, return_dict_in_generate=True)
        own = own_pass(truth_model, target, batch, truth)
    return Built(arch, target, batch, truth, batch.source_ids.shape[1], own)


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


def module_run(rec: Any) -> tuple[str, int]:
    """A record's module path and which of the module's runs per pass it holds: 1 unless
    its name says ``#n`` (``<site>[#n]:kind``)."""
    _, _, run = rec.name.split(":", 1)[0].partition("#")
    return rec.site.module, int(run or 1)


def test_decoding_parity(built: Built) -> None:
    target, batch, truth = built.target, built.batch, built.truth
    emitted = target.greedy(batch)
    assert torch.equal(emitted, truth.sequences[:, built.prompt:]), "greedy vs generate()"
    with torch.no_grad():
        logits = target.teacher_forced(batch, emitted)
    raw = torch.stack(truth.logits, dim=1)  # (B, T, V) before the logits processors
    steps = target.step_mask(emitted)

    def equal_logits(expected: torch.Tensor, what: str) -> None:
        scale = max(1.0, expected.abs().max().item())
        assert_close(logits[steps], expected[steps], f"teacher-forced vs {what}",
                     LOGIT_TOL * scale)

    on_own_pass(built, lambda: equal_logits(raw, "generate() logits"),
                lambda own: equal_logits(own.logits, "the model's own one pass"))
    _passed(built.arch, "parity")


def on_own_pass(built: Built, steps: Callable[[], None],
                one_pass: Callable[[OwnPass], None]) -> None:
    """Run the check against the model's own generate() steps (``steps``); where it fails
    and the model's own one pass is not its steps (:func:`own_pass`), the audit's one pass
    must instead equal that one pass (``one_pass``), which the summary lists."""
    try:
        steps()
    except AssertionError:
        if built.own is None:
            raise
        one_pass(built.own)
        OUTCOMES[f"{built.arch}/truth"] = built.own.gap


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
    modules = {module_run(r)[0] for r in records}
    eager = eager_by_module(truth.attentions, target.model.config, passes, modules)
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
    found = {kind: [r for r in views.records.values() if r.kind == kind]
             for kind in ("cross", "self")}
    for kind, recs in found.items():
        assert {module_run(r) for r in recs} == runs, f"{kind}: {[r.name for r in recs]}"

    def equal_views(maps: dict[str, list[list[torch.Tensor]]], row_of: Callable[..., Any],
                    tol: float) -> None:
        for kind, recs in found.items():
            for rec in recs:
                module, run = module_run(rec)
                rows = [row_of(maps[module], run - 1, t) for t in range(n_steps)]
                assert_view(rec, rows, kind, prompt, tol)  # rows (B, H, P+t)

    def own_views(own: OwnPass) -> None:
        whole = eager_by_module((own.attentions,), target.model.config, own.passes, modules)
        # continuation row t of the one pass: position P-1+t over P+t keys
        equal_views(whole, lambda m, r, t: m[0][r][:, :, prompt - 1 + t, : prompt + t],
                    own.tol)

    # step t's row over the sequence's keys, its last P+t (a lead's weight is a sink's)
    on_own_pass(built, lambda: equal_views(eager, lambda m, r, t: m[t][r][:, :, -1,
                                                                       -(prompt + t):], TOL),
                own_views)
    _passed(built.arch, "capture")


def assert_view(rec: Any, rows: list[torch.Tensor], kind: str, prompt: int,
                tol: float = TOL) -> None:
    """A teacher-forced view record (B, H, T, n) against eager's query row of each step t
    (B, H, P + t), cut and scaled as :func:`eager_view` says."""
    expected, defined = eager_view(rows, kind, prompt)
    assert_close(rec.weights[defined], expected[defined], f"{rec.name} ({kind} view)", tol)
    if rec.sink is not None:
        eager_sink = torch.stack([1 - row.double().sum(-1) for row in rows], -1).unsqueeze(-1)
        assert_close(rec.sink, eager_sink, f"{rec.name} ({kind} view's sink)", tol)
    assert torch.isfinite(rec.weights).all(), f"{rec.name}: a view is not finite"


def test_gate_is_healthy(built: Built) -> None:
    gate = attnaudit.audit(built.target, checks_only=True, progress=False).gate()
    assert gate.status == 0, gate.summary()
    _passed(built.arch, "gate")


def test_interventions_on_the_cached_step_or_the_rerun(built: Built) -> None:
    target, batch = built.target, built.batch
    ref = built.ref = reference(target, batch)
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


def test_contribution_suite_computes_or_says_why(built: Built) -> None:
    target, batch = built.target, built.batch
    ref = built.ref if built.ref is not None else reference(target, batch)
    parts: dict[str, list[Any]] = {}
    # leave-one-out's place is held by a fixed map: the suite's own numbers are checked
    # elsewhere (tests/auditing/test_contribution_suite.py), here only that it runs
    stand_in = torch.rand(ref.attention.shape, generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        add_contribution_parts(target, batch, ref, {"attention": ref.attention,
                                                    "loo": stand_in}, parts, zeroing=False)
    measures = parts["contribution_measures"][0].set_index("measure")
    # the quick report's suite: value zeroing listed as not run
    assert list(measures.index) == [*CONTRIBUTION_MEASURES, ZEROING]
    assert measures.loc[ZEROING, "status"] == "not run"
    measures = measures.drop(ZEROING)
    example = parts["contribution_example"][0]
    for measure, row in measures.iterrows():
        if row["status"] == "computed":
            values = example.loc[example["measure"] == measure, "value"]
            finite = torch.isfinite(torch.tensor(values.to_numpy(dtype=float)))
            assert len(values) and bool(finite.all()), f"{measure}: {values.tolist()}"
            continue
        # a reason in words, naming what is missing: no raw dict or list of the sites
        assert row["reason"] and not any(c in row["reason"] for c in ("{'", "['")), \
            row["reason"]
    OUTCOMES.setdefault(f"{built.arch}/contributions", ", ".join(
        m for m, r in measures.iterrows() if r["status"] != "computed"))
    _passed(built.arch, "contributions")


def test_summary_covered_architectures() -> None:
    """Runs last (pytest keeps file order): how many architectures were covered."""
    missing = sorted(set(ARCHITECTURES) - _RAN)
    if missing:
        pytest.skip(f"not every architecture ran here (missing {len(missing)})")
    covered = sorted(a for a in ARCHITECTURES if OUTCOMES.get(a) == "covered")
    skipped = {a: OUTCOMES[a] for a in ARCHITECTURES if OUTCOMES.get(a, "").startswith("skip")}
    xfailed = {a: XFAIL[a] for a in ARCHITECTURES if a in XFAIL}
    failed = sorted(set(ARCHITECTURES) - set(covered) - set(skipped) - set(xfailed))
    rerun = sorted(a for a in covered if OUTCOMES.get(f"{a}/path", "").startswith("re-run"))
    one_pass = sorted(a for a in covered if f"{a}/truth" in OUTCOMES)
    undecomposed = {a: OUTCOMES[f"{a}/contributions"] for a in covered
                    if OUTCOMES.get(f"{a}/contributions")}
    by_class: dict[str, int] = {}
    for reason in xfailed.values():
        by_class[reason] = by_class.get(reason, 0) + 1
    lines = [f"HF causal-LM architectures covered: {len(covered)} of {len(ARCHITECTURES)} "
             f"({len(rerun)} by the prefix re-run, {len(one_pass)} against their own one "
             f"pass); xfail: {len(xfailed)}; skipped: {len(skipped)}; failing: "
             f"{len(failed)} {failed}"]
    lines += [f"  xfail {n}: {reason}" for reason, n in sorted(by_class.items())]
    lines += [f"  {a}: {o}" for a, o in sorted(skipped.items())]
    lines += [f"  {a}: {OUTCOMES[a + '/path']}" for a in rerun]
    lines += [f"  {a}: against its own one pass: {OUTCOMES[a + '/truth']}" for a in one_pass]
    lines += [f"  {a}: contributions not computed: {m}" for a, m in sorted(undecomposed.items())]
    print("\n" + "\n".join(lines))
    assert len(covered) >= COVERED_FLOOR, "\n".join(lines)
    assert len(skipped) <= MAX_SKIPPED, "\n".join(lines)
