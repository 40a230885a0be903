"""Weights vs contributions in the suite: top keys and the per-measure summary against hand
computations, and the suite on the date BART against the models' own eager attention and
the contribution maps computed directly."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from attnaudit.auditing.contribution_suite import contribution_tables, top_keys
from attnaudit.auditing.intervention_suite import run_suite
from attnaudit.contributions import measure_maps
from attnaudit.targets.loading import load_target
from tests.helpers.date_bart_eager import decoder_layer_output

transformers = pytest.importorskip("transformers")

from tests.helpers.date_bart_eager import eager_cross_attention  # noqa: E402

BART = "attnaudit_examples.date_transformer.target:make_target"


def test_top_keys_equal_a_numpy_argmax_over_eligible_keys():
    gen = torch.Generator().manual_seed(0)
    values = {"attention": torch.rand(3, 4, 5, generator=gen),
              "alti": torch.rand(3, 4, 5, generator=gen),
              "loo": torch.rand(3, 4, 5, generator=gen)}
    values["loo"][1, 2] = 0.25  # constant over the eligible keys: undecided
    keys = torch.tensor([[True, True, False, True, True], [False, True, True, True, False],
                         [False, False, False, False, False]])
    steps = torch.tensor([[True, True, True, False], [True, True, True, True],
                          [True, True, False, False]])
    found = top_keys(values, keys, steps)
    expected = []
    for b in range(3):
        for t in range(4):
            if not steps[b, t] or not keys[b].any():
                continue
            eligible = np.nonzero(keys[b].numpy())[0]
            row = {"example": b, "step": t}
            for name, v in values.items():
                row[f"top_{name}"] = int(eligible[np.argmax(v[b, t].numpy()[eligible])])
            loo = values["loo"][b, t].numpy()[eligible]
            row["loo_decided"] = bool(loo.max() > loo.min())
            expected.append(row)
    pd.testing.assert_frame_equal(found, pd.DataFrame(expected), check_dtype=False)


def test_summary_shares_equal_a_hand_count():
    rows = pd.DataFrame({"example": [0, 0, 1, 1], "step": [0, 1, 0, 1],
                         "top_attention": [0, 1, 2, 3], "top_alti": [0, 2, 2, 0],
                         "top_loo": [0, 2, 1, 0], "loo_decided": [True, True, True, False]})
    summary = pd.DataFrame({"method_a": ["attention"], "method_b": ["loo"], "n": [4],
                            "kendall_tau_mean": [0.5], "top_k_overlap_mean": [0.7]})
    mine = pd.DataFrame({"method_a": ["alti"], "method_b": ["loo"], "n": [4],
                         "kendall_tau_mean": [0.25], "top_k_overlap_mean": [0.6]})
    measures = pd.DataFrame({"measure": ["alti", "alti"], "reading": ["r", "r"],
                             "status": ["computed"] * 2, "reason": ["", ""]})
    out = contribution_tables({"top_keys": rows, "agreement_summary": summary,
                               "contribution_agreement_summary": mine,
                               "contribution_measures": measures})
    table = out["weights_vs_contributions"].set_index("measure")
    # alti's top key differs from the weights' in rows 1 and 3 of 4; among the 3 decided
    # rows, the weights' top key is the leave-one-out one in row 0 only, alti's in 0 and 1
    assert table.loc["alti", "top_differs_from_weights"] == pytest.approx(2 / 4)
    assert table.loc["weights", "top_differs_from_weights"] == 0.0
    assert table.loc["weights", "top_is_loo_top"] == pytest.approx(1 / 3)
    assert table.loc["alti", "top_is_loo_top"] == pytest.approx(2 / 3)
    assert table.loc["weights", "kendall_tau_vs_loo"] == 0.5
    assert table.loc["alti", "top_k_overlap_vs_loo"] == 0.6
    assert len(out["contribution_measures"]) == 1


def test_suite_on_the_date_bart_against_eager_attention_and_direct_maps():
    target = load_target(BART)
    suite = run_suite(target, quick=True, limit=3, progress=False, n_permutations=2,
                      cumulative_examples=0, attribution=None)
    table = suite.tables["weights_vs_contributions"].set_index("measure")
    assert {"weights", "value_norm", "alti", "rollout", "saliency"} <= set(table.index)
    measures = suite.tables["contribution_measures"].set_index("measure")["status"]
    assert measures.to_dict() == {"value_norm": "computed", "alti": "computed",
                                  "rollout": "computed", "value_zeroing": "not run"}
    assert len(suite.tables["sinks"]) == 24  # 6 sites x 4 heads

    batch = next(target.iter_batches(3))
    emitted = target.greedy(batch)
    weights = eager_cross_attention(batch, emitted)  # (B, T, S)
    norms = measure_maps(target, batch, emitted, ("value_norm",))["value_norm"].mean(1)
    keys, steps = target.explain_keys(batch), target.step_mask(emitted)
    differ = []
    for b, t in steps.nonzero().tolist():
        eligible = keys[b].nonzero().squeeze(1)
        differ.append(int(eligible[weights[b, t, eligible].argmax()])
                      != int(eligible[norms[b, t, eligible].argmax()]))
    assert table.loc["value_norm", "rows"] == len(differ)
    assert table.loc["value_norm", "top_differs_from_weights"] == pytest.approx(np.mean(differ))


def _eager_bart_value_zeroing(batch, emitted) -> torch.Tensor:
    """(B, T, S) the date BART's value zeroing from Hugging Face's own eager forward: per
    decoder layer l and source key j, the cosine distance of layer l's output when the
    cross-attention's value of key j is set to 0 (its ``v_proj`` output row, bias
    included), normalised per row (:func:`per_row_shares`), averaged over the layers."""
    from attnaudit_examples.date_transformer.model import MODEL_DIR

    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(
        MODEL_DIR, attn_implementation="eager").eval()
    start = torch.full_like(emitted[:, :1], model.config.decoder_start_token_id)
    inputs = {"input_ids": batch.source_ids, "attention_mask": batch.source_mask.long(),
              "decoder_input_ids": torch.cat([start, emitted[:, :-1]], 1)}
    layers = model.model.decoder.layers

    def layer_output(layer, key=None) -> torch.Tensor:
        return decoder_layer_output(model, inputs, layer, key).double()

    per_layer = []
    for layer in layers:
        plain = layer_output(layer)
        per_layer.append(per_row_shares(torch.stack([
            1 - torch.nn.functional.cosine_similarity(layer_output(layer, j), plain, dim=-1)
            for j in range(batch.source_ids.shape[1])], -1), batch.source_mask))
    return torch.stack(per_layer).mean(0)


def per_row_shares(distances: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Mohebbi et al.'s normalisation by hand: each query row's distances (B, T, S) over the
    real source keys (``real`` (B, S) bool), divided by their sum; 0 elsewhere."""
    kept = distances * real[:, None, :]
    return kept / kept.sum(-1, keepdim=True)


def test_a_full_audit_compares_value_zeroing_too():
    from attnaudit.auditing.contribution_suite import add_contribution_parts
    from attnaudit.interventions.reference_run import reference

    target = load_target(BART)
    batch = next(target.iter_batches(2))
    ref = reference(target, batch)
    parts: dict[str, list[pd.DataFrame]] = {}
    stand_in_loo = torch.rand(ref.attention.shape, generator=torch.Generator().manual_seed(0))
    add_contribution_parts(target, batch, ref, {"attention": ref.attention, "loo": stand_in_loo},
                           parts, zeroing=True)
    measures = parts["contribution_measures"][0]
    assert list(measures["measure"]) == ["value_norm", "alti", "rollout", "value_zeroing"]
    rows = parts["top_keys"][0]
    zeroed = _eager_bart_value_zeroing(batch, ref.emitted)
    keys = target.explain_keys(batch)
    for row in rows.itertuples(index=False):
        eligible = keys[row.example].nonzero().squeeze(1)
        values = zeroed[row.example, row.step, eligible]
        # the top key, or one the reference puts within rounding of it (a tie)
        assert values[eligible.tolist().index(row.top_value_zeroing)] >= values.max() - 1e-6


def _hand_value_zeroing(model, batch, emitted) -> torch.Tensor:
    """(B, T, n) the date LSTM's value zeroing from its parameters: the cosine distance of
    each step's logits (the model's output, the layer above its one attention site) when key
    j's weight is set to 0 at every step without renormalising, teacher-forced on the
    decoder inputs of ``emitted``."""
    from attnaudit_examples.date.target import decoder_inputs
    from tests.helpers.date_reference import hand_written_decode, weighted_read

    src, lengths = batch.source_ids, batch.inputs["lengths"]
    tgt_in = decoder_inputs(emitted)

    def logits(read=weighted_read) -> torch.Tensor:
        seen: list[torch.Tensor] = []
        handle = model.out.register_forward_hook(lambda m, a, out: seen.append(out))
        try:
            hand_written_decode(model, src, lengths, tgt_in, read=read)
        finally:
            handle.remove()
        return torch.stack(seen, 1).double()  # (B, T, V)

    plain = logits()
    columns = []
    for j in range(src.shape[1]):
        def zeroed(t, w, memory, j=j):
            return weighted_read(t, w.index_fill(1, torch.tensor([j]), 0.0), memory)
        columns.append(1 - torch.nn.functional.cosine_similarity(logits(zeroed), plain, dim=-1))
    real = torch.arange(src.shape[1])[None, :] < torch.as_tensor(lengths)[:, None]
    return per_row_shares(torch.stack(columns, -1), real)  # (B, T, n)


def test_the_date_lstm_computes_value_zeroing_and_says_why_not_for_the_rest():
    # additive attention without values: value norms, ALTI and rollout cannot be computed,
    # each says why in its own words; value zeroing only edits weights, so it is computed,
    # and its top keys equal the model's parameters' own on every example, not just the first
    from attnaudit.auditing.contribution_suite import add_contribution_parts
    from attnaudit.interventions.reference_run import reference
    from attnaudit_examples.date.target import make_target

    target = make_target(limit=3, batch_size=3)
    batch = next(target.iter_batches())
    ref = reference(target, batch)
    parts: dict[str, list[pd.DataFrame]] = {}
    stand_in_loo = torch.rand(ref.attention.shape, generator=torch.Generator().manual_seed(0))
    add_contribution_parts(target, batch, ref, {"attention": ref.attention, "loo": stand_in_loo},
                           parts, zeroing=True)
    measures = parts["contribution_measures"][0].set_index("measure")
    assert measures.loc["value_zeroing", "status"] == "computed"
    assert (measures.loc[["value_norm", "alti", "rollout"], "status"] == "not applicable").all()
    reasons = measures["reason"]
    assert reasons["value_norm"].startswith("no value norms at attend:cross, because no values")
    assert reasons["alti"].startswith("no ALTI decomposition at attend:cross, because no values")
    assert reasons["rollout"].startswith("composition needs encoder self-attention")
    assert reasons["rollout"].endswith("found attend:cross")
    assert not any("{" in r or "[" in r for r in reasons)
    expected = _hand_value_zeroing(target.model, batch, ref.emitted)
    keys = target.explain_keys(batch)
    rows = parts["top_keys"][0]
    assert set(rows["example"]) == {0, 1, 2}
    for row in rows.itertuples(index=False):
        eligible = keys[row.example].nonzero().squeeze(1)
        values = expected[row.example, row.step, eligible]
        top = values.max()
        # the top key, or one the reference puts within rounding of it (a tie)
        assert values[eligible.tolist().index(row.top_value_zeroing)] >= top - 1e-6 * top.abs()
    example = parts["contribution_example"][0]
    zero = example[example["measure"] == "value_zeroing"]
    got = torch.tensor(zero["value"].to_numpy(), dtype=torch.float64)
    want = expected[0][zero["step"].to_numpy(), zero["key"].to_numpy()]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_the_suite_reads_rollout_after_the_last_layer_as_an_eager_numpy_rollout(tmp_path):
    # a decoder-only GPT-2 of three layers: the suite's rollout map (B, T, P) is the
    # composition through every layer, read at the output steps, here recomputed in numpy
    # from the eager model's own attentions (no attnaudit in the reference)
    from attnaudit.auditing.contribution_suite import contribution_importances
    from attnaudit.targets.hf.loading import from_hf
    from tests.helpers.tiny_hf import save_checkpoint, tiny_config

    config = tiny_config(transformers.GPT2Config, {"n_layer": 3})
    save_checkpoint(transformers.GPT2LMHeadModel, config, tmp_path, eos_after=False)
    prompts = ["w5 w6 w7 w8", "w10 w11 w12 w13"]  # one length: no padding
    target = from_hf(tmp_path, prompts, max_new_tokens=3)
    batch = next(target.iter_batches())
    emitted = target.greedy(batch)
    found, reasons = contribution_importances(target, batch, emitted, ("rollout",))
    assert not reasons
    eager = transformers.GPT2LMHeadModel.from_pretrained(
        tmp_path, attn_implementation="eager").eval()
    ids = torch.cat([batch.source_ids, emitted[:, :-1]], 1)
    with torch.no_grad():
        attentions = eager(ids, output_attentions=True).attentions
    assert len(attentions) == 3
    prompt, steps = batch.source_ids.shape[1], emitted.shape[1]
    for b in range(len(prompts)):
        rolled = np.eye(ids.shape[1])
        for layer in attentions:
            block = 0.5 * (layer[b].double().mean(0).numpy() + np.eye(ids.shape[1]))
            rolled = (block / block.sum(-1, keepdims=True)) @ rolled
        expected = rolled[prompt - 1 : prompt - 1 + steps, :prompt]
        np.testing.assert_allclose(found["rollout"][b].double().numpy(), expected,
                                   atol=1e-5, rtol=1e-4)
