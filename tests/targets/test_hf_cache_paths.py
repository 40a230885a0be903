"""The cached intervention step on a model's own cache object, its fallback to the prefix
re-run, and the target-side config edges of decoder-only checkpoints.

- ``cache_before`` cuts the model's own ``DynamicCache`` to the selected rows and first
  positions through its own API, equal to slicing its tensors by hand, and leaves the
  original as it was, a step run on the copy included; a cache layer outside transformers'
  dynamic ones (which may write in place) is copied whole first;
- a hybrid model whose cache holds linear-attention (recurrent) state cannot take one cached
  step: ``attnaudit report --quick`` still writes the interventions, by the prefix re-run,
  and the manifest says so and why;
- a cached step that disagrees with the teacher-forced pass is not used: edited items
  re-run the prefix, with the reason; a call of several steps (``decode_steps``) that
  disagrees is not used either: items run one step per call;
- a report whose intervention suite cannot run exits 3 and says why (never a silent "not
  recorded");
- a config without ``pad_token_id`` pads with the tokenizer's pad; ``max_position_embeddings
  = -1`` sets no limit; the inseq attribution variant runs on a decoder-only model (the
  target passes the tokenizer's unk id).
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

import attnaudit
import attnaudit.auditing.orchestration as orchestration
import attnaudit.cli
from attnaudit.attribution.options import AttributionOptions
from attnaudit.auditing.intervention_suite import run_suite
from attnaudit.errors import InterventionError
from attnaudit.interventions.ablation import uniform_test
from attnaudit.interventions.reference_run import reference
from attnaudit.targets.hf.cache import cache_argument, cache_before, cache_state

transformers = pytest.importorskip("transformers")

from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # noqa: E402

from tests.helpers.tiny_causal import tiny_causal_config  # noqa: E402
from tests.helpers.tiny_hf import VOCAB, save_checkpoint  # noqa: E402

PROMPTS = ["w5 w6 w7 w8 w9", "w10 w11", "w12 w13 w14 w15"]


def llama_config(**changes):
    settings = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "max_position_embeddings": 32, "initializer_range": 0.3, "bos_token_id": 1,
                "eos_token_id": 2, "pad_token_id": 0, **changes}
    return transformers.LlamaConfig(**settings)


def test_cache_before_cuts_the_models_own_cache_by_its_api():
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(llama_config()).eval()
    with torch.no_grad():
        cache = model(input_ids=torch.randint(3, VOCAB, (3, 6)), use_cache=True).cache
    keys = [layer.keys.clone() for layer in cache.layers]
    state = cache_state(cache, 3, 6, torch.device("cpu"))
    state["rows"] = torch.tensor([2, 0, 2])  # as select_state leaves it: rows repeat
    cut = cache_before(state, 4)
    assert type(cut) is type(cache)
    for layer, original, kept in zip(cut.layers, cache.layers, keys, strict=True):
        assert torch.equal(layer.keys, kept[[2, 0, 2], :, :4])
        assert torch.equal(layer.values, original.values[[2, 0, 2], :, :4])
        assert torch.equal(original.keys, kept)  # the model's cache is left as it was
    with torch.no_grad():  # a step on the cut copy leaves the model's cache as it was too
        model(input_ids=torch.randint(3, VOCAB, (3, 1)), use_cache=True,
              **{cache_argument(model): cut})
    for layer, original, kept in zip(cut.layers, cache.layers, keys, strict=True):
        assert layer.keys.shape[2] == 5 and torch.equal(original.keys, kept)


def test_a_cache_layer_that_writes_in_place_is_copied_before_its_rows_are_selected():
    """A layer class outside transformers' dynamic layers may select rows in place: the
    copy it selects from must then hold its own tensors."""
    from transformers.cache_utils import DynamicLayer

    class InPlaceLayer(DynamicLayer):
        def reorder_cache(self, beam_idx: torch.Tensor) -> None:
            self.keys.copy_(self.keys.index_select(0, beam_idx))
            self.values.copy_(self.values.index_select(0, beam_idx))

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(llama_config()).eval()
    with torch.no_grad():
        cache = model(input_ids=torch.randint(3, VOCAB, (3, 6)), use_cache=True).cache
    for layer in cache.layers:
        layer.__class__ = InPlaceLayer
    keys = [layer.keys.clone() for layer in cache.layers]
    state = cache_state(cache, 3, 6, torch.device("cpu"))
    state["rows"] = torch.tensor([2, 0, 1])
    cut = cache_before(state, 6)
    for layer, original, kept in zip(cut.layers, cache.layers, keys, strict=True):
        assert torch.equal(layer.keys, kept[[2, 0, 1]]) and torch.equal(original.keys, kept)


def test_report_on_a_hybrid_cache_model_reruns_the_prefix_and_says_why(tmp_path):
    """qwen3_next: one gated-delta-net (linear attention) layer and one attention layer; the
    linear layer's recurrent state holds only its last position."""
    arch, model_cls = "qwen3_next", transformers.Qwen3NextForCausalLM
    folder = tmp_path / arch
    config = tiny_causal_config(CONFIG_MAPPING[arch], model_cls, arch)
    assert config.layer_types == ["linear_attention", "full_attention"]
    save_checkpoint(model_cls, config, folder, eos_after=False)
    data = tmp_path / "prompts.txt"
    data.write_text("".join(f"{p}\n" for p in PROMPTS))
    out = tmp_path / "report"
    status = attnaudit.cli.main(["--quiet", "report", "--hf", str(folder), "--data", str(data),
                                 "--quick", "--max-new-tokens", "3", "--out", str(out)])
    assert status == 0
    manifest = json.loads((out / "manifest.json").read_text())
    ran = manifest["interventions"]
    assert ran["ran"] is True
    assert ran["edited_items"].startswith("decoder prefix re-run (one cached step could not "
                                          "be taken: TargetError:")
    rows = pd.read_csv(out / "rows.csv")  # the per-row intervention table
    assert len(rows) >= 1 and rows["uniform_tvd"].notna().all()


def test_a_report_whose_suite_cannot_run_exits_3_and_says_why(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "llama"
    save_checkpoint(transformers.LlamaForCausalLM, llama_config(), folder, eos_after=False)
    data = tmp_path / "prompts.txt"
    data.write_text("".join(f"{p}\n" for p in PROMPTS))

    def failing_suite(*args, **kwargs):
        raise InterventionError("no cached step and no re-run")

    monkeypatch.setattr(orchestration, "run_suite", failing_suite)
    out = tmp_path / "report"
    status = attnaudit.cli.main(["--quiet", "report", "--hf", str(folder), "--data", str(data),
                                 "--quick", "--max-new-tokens", "2", "--out", str(out)])
    assert status == 3
    assert "no cached step and no re-run" in capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["interventions"]["ran"] is False
    assert "no cached step and no re-run" in manifest["interventions"]["reason"]


def test_config_edges_pad_from_tokenizer_no_position_limit_and_inseq(tmp_path):
    folder = tmp_path / "llama"
    save_checkpoint(transformers.LlamaForCausalLM, llama_config(), folder, eos_after=False)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.LlamaForCausalLM.from_pretrained(folder).eval()
    del model.config.pad_token_id  # a config that never names one
    model.config.max_position_embeddings = -1  # "no limit"
    long_prompt = " ".join(f"w{i}" for i in range(3, 43))  # 40 tokens, over the old 32
    target = attnaudit.from_hf(model, [long_prompt, *PROMPTS[1:]], tokenizer=tokenizer,
                               max_new_tokens=2)
    batch = next(target.iter_batches())
    assert batch.source_ids.shape[1] == 40 and target.truncation.startswith("sources were not")
    assert (batch.source_ids[~batch.source_mask] == tokenizer.pad_token_id).all()
    assert target.unk_id == tokenizer.unk_token_id is not None
    suite = run_suite(target, quick=True, progress=False, n_permutations=2,
                      attribution=AttributionOptions.variant("inseq", methods=("saliency",)))
    assert suite.metadata["attribution_variants"]["saliency"]


def test_a_cached_step_that_disagrees_with_teacher_forcing_falls_back_to_the_rerun(tmp_path):
    folder = tmp_path / "llama"
    save_checkpoint(transformers.LlamaForCausalLM, llama_config(), folder, eos_after=False)
    target = attnaudit.from_hf(folder, PROMPTS, max_new_tokens=3)
    batch = next(target.iter_batches())
    assert reference(target, batch).states is not None  # the model's own cache serves

    def shifted_step(batch, encoded, states, emitted, step):  # a cache off by one position
        return target.decode_step(batch, encoded, states, emitted, max(step - 1, 0))

    off = target.with_options(decode_step=shifted_step, decode_steps=None)
    ref = reference(off, batch)
    assert ref.states is None
    assert ref.cache_note.startswith("one cached step disagreed with the teacher-forced pass "
                                     "at step 2 (total variation ")
    rerun = reference(target, batch, incremental=False)
    rows = ref.rows()
    got = uniform_test(off, ref, rows)["uniform_tvd"]
    assert (got - uniform_test(target, rerun, rows)["uniform_tvd"]).abs().max() <= 1e-6


def test_a_call_of_several_steps_that_disagrees_is_not_used(tmp_path):
    """``decode_steps`` running every row at the latest step fails its check: items then
    run one step per call, and the numbers stay the re-run's."""
    folder = tmp_path / "llama"
    save_checkpoint(transformers.LlamaForCausalLM, llama_config(), folder, eos_after=False)
    target = attnaudit.from_hf(folder, PROMPTS, max_new_tokens=4)
    batch = next(target.iter_batches())

    def latest(batch, encoded, states, emitted, steps):  # every row at the latest step
        return target.decode_steps(batch, encoded, states, emitted, steps.max().expand_as(steps))

    off = target.with_options(decode_steps=latest)
    ref = reference(off, batch)
    assert ref.states is not None and not ref.mixed_steps and ref.cache_note is None
    assert reference(target, batch).mixed_steps
    rows = ref.rows()
    got = uniform_test(off, ref, rows)["uniform_tvd"]
    rerun = reference(target, batch, incremental=False)
    assert (got - uniform_test(target, rerun, rows)["uniform_tvd"]).abs().max() <= 1e-6
