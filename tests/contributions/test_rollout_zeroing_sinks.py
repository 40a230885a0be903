"""Rollout against a numpy product of the eager weights, value zeroing against a hand re-run
with v_j = 0 (a hook zeroing the value projection's output at j), the sink table on a planted
sink, values found by role where capture cannot see them (the eager backend), and what a
target whose values cannot be found gets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnaudit
from attnaudit.contributions import ALL_MEASURES, contributions, measure_maps, sink_table, zeroing
from attnaudit.contributions.sinks import SINK_SHARE, SiteKeys, sink_rows
from attnaudit.errors import ContributionError
from attnaudit.targets.hf.loading import from_hf
from tests.helpers.date_bart_eager import decoder_layer_output

transformers = pytest.importorskip("transformers")

from tests.helpers.tiny_targets import (  # noqa: E402
    NEW_TOKENS,
    SOURCES,
    decoder_inputs,
    eager_model,
    prompt_inputs,
    save_tiny,
)

TOL = 1e-5


@pytest.fixture(scope="module")
def bart(tmp_path_factory):
    folder = save_tiny("bart", tmp_path_factory.mktemp("bart"))
    target = from_hf(folder, SOURCES, max_new_tokens=NEW_TOKENS)
    batch = next(target.iter_batches())
    return folder, target, batch, target.greedy(batch)


def _half_plus_identity(weights: np.ndarray) -> np.ndarray:
    """½(Ā + I), rows normalised, Ā the head mean: (B, H, Q, Q) -> (B, Q, Q)."""
    mean = weights.mean(1)
    rows = 0.5 * (mean + np.eye(mean.shape[-1]))
    return rows / rows.sum(-1, keepdims=True)


def test_decoder_only_rollout_is_the_numpy_product_of_half_weights_plus_identity(tmp_path):
    folder = save_tiny("gpt2", tmp_path)
    target = from_hf(folder, SOURCES, max_new_tokens=NEW_TOKENS)
    batch = next(target.iter_batches())
    emitted = target.greedy(batch)
    maps = measure_maps(target, batch, emitted, ["rollout", "weights"])
    with torch.no_grad():
        out = eager_model("gpt2", folder)(**prompt_inputs(batch, emitted),
                                          output_attentions=True)
    prompt, steps = batch.source_ids.shape[1], emitted.shape[1]
    product = None
    for layer, weights in enumerate(out.attentions):
        block = _half_plus_identity(weights.double().numpy())
        product = block if product is None else block @ product
        rows = slice(prompt - 1, prompt - 1 + steps)
        np.testing.assert_allclose(maps["rollout"][:, layer].double().numpy(),
                                   product[:, rows], atol=TOL, rtol=0)
        np.testing.assert_allclose(maps["weights"][:, layer].double().numpy(),
                                   weights.double().mean(1).numpy()[:, rows], atol=TOL, rtol=0)


def test_encoder_decoder_rollout_composes_through_cross_attention(bart):
    folder, target, batch, emitted = bart
    maps = measure_maps(target, batch, emitted, ["rollout"])
    model = eager_model("bart", folder)
    with torch.no_grad():
        out = model(input_ids=batch.source_ids, attention_mask=batch.source_mask.long(),
                    decoder_input_ids=decoder_inputs(model, emitted), output_attentions=True)
    encoder = None
    for weights in out.encoder_attentions:
        block = _half_plus_identity(weights.double().numpy())
        encoder = block if encoder is None else block @ encoder
    batch_size, n = batch.source_ids.shape
    steps = emitted.shape[1]
    # a step's representation over [source tokens | prefix inputs]; before layer 0, itself
    current = np.concatenate([np.zeros((batch_size, steps, n)),
                              np.broadcast_to(np.eye(steps), (batch_size, steps, steps))], -1)
    for layer, (own, cross) in enumerate(zip(out.decoder_attentions, out.cross_attentions,
                                             strict=True)):
        self_part = _half_plus_identity(own.double().numpy()) @ current
        source_part = 0.5 * cross.double().numpy().mean(1) @ encoder
        current = 0.5 * self_part
        current[..., :n] += source_part
        current /= current.sum(-1, keepdims=True)
        np.testing.assert_allclose(maps["rollout"][:, layer].double().numpy(),
                                   current[..., :n], atol=TOL, rtol=0)


def test_value_zeroing_equals_a_re_run_with_that_value_zeroed(bart, monkeypatch):
    folder, target, batch, emitted = bart
    monkeypatch.setattr(zeroing, "COPIES", 4)  # six keys: two chunks of edited copies
    maps = measure_maps(target, batch, emitted, ["value_zeroing", "value_zeroing_raw"])
    model = eager_model("bart", folder)
    layer = model.model.decoder.layers[1]
    b = 0  # the longest source: no padding in a batch of one
    inputs = {"input_ids": batch.source_ids[b:b + 1],
              "attention_mask": batch.source_mask[b:b + 1].long(),
              "decoder_input_ids": decoder_inputs(model, emitted[b:b + 1])}

    def layer_output(zero_key: int | None) -> torch.Tensor:
        return decoder_layer_output(model, inputs, layer, zero_key)[0]

    reference = layer_output(None)
    distances = []
    for key in range(batch.source_ids.shape[1]):
        zeroed = layer_output(key)
        distance = 1 - torch.nn.functional.cosine_similarity(zeroed, reference, dim=-1)
        torch.testing.assert_close(maps["value_zeroing_raw"][b, 1, :, key], distance,
                                   atol=TOL, rtol=0)
        distances.append(distance.double().numpy())
    # Mohebbi et al.: each query row's distances over its keys (all read here) sum to 1
    raw = np.stack(distances, -1)
    np.testing.assert_allclose(maps["value_zeroing"][b, 1].double().numpy(),
                               raw / raw.sum(-1, keepdims=True), atol=TOL, rtol=0)


def test_measure_maps_share_one_shape_and_alti_rows_split_source_and_prefix(bart):
    _, target, batch, emitted = bart
    maps = measure_maps(target, batch, emitted, ALL_MEASURES)
    shape = (len(batch), 2, emitted.shape[1], batch.source_ids.shape[1])
    assert {name: tuple(m.shape) for name, m in maps.items()} == dict.fromkeys(ALL_MEASURES,
                                                                             shape)
    assert all(m.dtype == torch.float32 for m in maps.values())
    share = maps["alti"].sum(-1)
    assert bool(((share > 0) & (share <= 1 + 1e-5)).all())


def test_the_sink_table_flags_a_planted_sink():
    torch.manual_seed(0)
    batch, heads, queries, keys = 3, 4, 5, 6
    weights = torch.softmax(0.1 * torch.randn(batch, heads, queries, keys), -1)
    weights[:, 1] = 0.1 * weights[:, 1] / weights[:, 1, :, [0, 1, 3, 4, 5]].sum(-1,
                                                                                  keepdim=True)
    weights[:, 1, :, 2] = 0.9
    norms = torch.ones(batch, heads, keys)
    norms[:, :, 2] = 0.2
    special = torch.zeros(batch, keys, dtype=torch.bool)
    special[:, 2] = True
    labels = [[f"t{j}" if j != 2 else "</s>" for j in range(keys)] for _ in range(batch)]
    rows = sink_rows(SiteKeys("toy", "cross", weights, norms, "f_h(x_j)",
                              torch.ones(batch, queries, dtype=torch.bool),
                              torch.ones(batch, keys, dtype=torch.bool), special, labels))
    assert [row["sink"] for row in rows] == [False, True, False, False]
    sink = rows[1]
    assert (sink["token"], sink["position"], sink["special"]) == ("</s>", 2, True)
    assert sink["share"] == pytest.approx(0.9) and sink["rows_over"] == 1.0
    mean_norm = (0.2 + 5) / 6
    assert sink["value_norm_ratio"] == pytest.approx(0.2 / mean_norm)


def test_sink_table_covers_every_site_and_head(bart):
    _, target, batch, emitted = bart
    table = sink_table(contributions(target, batch, emitted))
    assert len(table) == 6 * 4  # 6 sites, 4 heads
    assert set(table["norm_of"]) == {"f_h(x_j)"}
    assert table["share"].between(0, 1).all()


def test_eager_attention_values_are_found_by_role_and_equal_the_sdpa_ones(bart):
    folder, sdpa_target, batch, emitted = bart
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    target = from_hf(eager_model("bart", folder), SOURCES, tokenizer=tokenizer,
                     max_new_tokens=NEW_TOKENS)
    eager = contributions(target, batch, emitted)
    sdpa = contributions(sdpa_target, batch, emitted)
    assert {s.values_from for s in sdpa.trace.sites.values()} == {"capture"}
    for name, site in eager.trace.sites.items():
        assert site.values_from.endswith("v_proj"), site.values_from
        assert name.rsplit(":", 1)[0] in site.values_from
        torch.testing.assert_close(site.values, sdpa.trace.sites[name].values,
                                   atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(eager.value_norms[name].summed,
                                   sdpa.value_norms[name].summed, atol=1e-5, rtol=1e-5)
    assert [c.status for c in eager.checks] == ["pass"] * 6


def test_a_custom_target_gets_its_weights_and_a_reason_for_the_rest():
    from attnaudit_examples.date.target import make_target

    target = make_target()
    batch = next(target.iter_batches(4))
    emitted = target.greedy(batch)
    maps = measure_maps(target, batch, emitted, ["weights"])
    with attnaudit.capture(target.model) as cap, torch.no_grad():
        target.teacher_forced(batch, emitted)
    (record,) = cap.records.values()
    torch.testing.assert_close(maps["weights"][:, 0], record.weights.float().mean(1))
    with pytest.raises(ContributionError, match="softmax path does not expose values"):
        measure_maps(target, batch, emitted, ["value_norm"])
    with pytest.raises(ContributionError, match="composition needs encoder self-attention"):
        measure_maps(target, batch, emitted, ["rollout"])


def test_emitted_ids_that_do_not_fit_the_batch_are_refused(bart):
    _, target, batch, emitted = bart
    for wrong in (emitted[:1], emitted[:, :0], emitted.float(), emitted[0]):
        with pytest.raises(ContributionError, match="emitted must be integer ids"):
            measure_maps(target, batch, wrong)
    with pytest.raises(ContributionError, match="unknown measures"):
        measure_maps(target, batch, emitted, ["attention"])


def test_the_sink_table_leaves_padded_query_rows_and_keys_out_as_a_per_example_count():
    # padded query rows put more than the sink share on every key, real rows much on a
    # padded key, and padded keys carry large norms: the table must read only real rows and
    # eligible keys, example by example (reference: plain loops in float64)
    gen = torch.Generator().manual_seed(3)
    batch, heads, queries, keys = 3, 2, 6, 7
    weights = torch.softmax(2 * torch.randn(batch, heads, queries, keys, generator=gen), -1)
    real_rows = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]],
                             dtype=torch.bool)
    eligible = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0],
                             [0, 1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    for b in range(batch):
        padded = (~eligible[b]).nonzero().squeeze(1)
        if len(padded):
            weights[b, :, :, padded[-1]] += 3.0
    weights = weights / weights.sum(-1, keepdim=True)
    for b in range(batch):  # padded rows: anything (here over the sink share at every key)
        weights[b, :, ~real_rows[b]] = 0.9
    norms = torch.rand(batch, heads, keys, generator=gen) + 0.5
    norms[~eligible[:, None, :].expand_as(norms)] = 50.0
    labels = [[f"b{b}k{j}" for j in range(keys)] for b in range(batch)]
    rows = sink_rows(SiteKeys("toy", "cross", weights, norms, "f_h(x_j)", real_rows, eligible,
                              torch.zeros(batch, keys, dtype=torch.bool), labels))
    w, n = weights.double().numpy(), norms.double().numpy()
    for h, row in enumerate(rows):
        tops, shares, ratios, over, counted = [], [], [], 0, 0
        for b in range(batch):
            real = [q for q in range(queries) if real_rows[b, q]]
            keep = [j for j in range(keys) if eligible[b, j]]
            mass = {j: sum(w[b, h, q, j] for q in real) / len(real) for j in keep}
            top = max(keep, key=lambda j: mass[j])
            tops.append(top)
            shares.append(mass[top])
            ratios.append(n[b, h, top] / (sum(n[b, h, j] for j in keep) / len(keep)))
            over += sum(w[b, h, q, top] > SINK_SHARE for q in real)
            counted += len(real)
        assert row["share"] == pytest.approx(sum(shares) / batch, rel=1e-5)
        assert row["rows_over"] == pytest.approx(over / counted)
        assert row["value_norm_ratio"] == pytest.approx(sum(ratios) / batch, rel=1e-5)
        assert row["position"] == max(set(tops), key=lambda j: (tops.count(j), -tops.index(j)))
