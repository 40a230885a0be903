"""The attention explorer's data: the page's payload holds exactly the numbers of
``attention_maps.csv``, those are the model's own attention (eager Hugging Face
``output_attentions``), the kept examples stay bounded, findings reach the map, and a bare
capture is shown through :func:`attnaudit.show`."""

from __future__ import annotations

import base64

import numpy as np
import pandas as pd
import pytest
import torch

import attnaudit
from attnaudit.analysis.example_maps import START_LABEL
from attnaudit.errors import ExplorerError
from attnaudit.record import AttentionCall, AttentionRecord, Site
from attnaudit.report.explorer import DEFAULT_EXAMPLES, decode, encode
from attnaudit.report.figures import visible_token
from attnaudit.validity.pipeline import run_validity_audit
from tests.conftest import BART_LIMIT
from tests.helpers.report_page import page_data

PAGE_BUDGET = 3_000_000

def f32(measure: dict, shape: list[int]) -> np.ndarray:
    """A measure read back by hand: base64 of little-endian float32 in C order."""
    layers, _, queries, keys = shape
    raw = base64.b64decode(measure["data"])
    return np.frombuffer(raw, dtype="<f4").reshape(layers, measure["heads"], queries, keys)


@pytest.fixture(scope="module")
def bart_report(cli_reports):
    """``attnaudit report <date BART> --limit 8 --quick``: the default explorer examples."""
    return cli_reports("date_transformer")


def test_the_page_holds_exactly_the_numbers_of_the_csv(bart_report):
    html = (bart_report / "index.html").read_text(encoding="utf-8")
    assert len(html.encode("utf-8")) <= PAGE_BUDGET
    data = page_data(html)
    maps = pd.read_csv(bart_report / data["csv"], keep_default_na=False,
                       dtype={"query_token": str, "key_token": str})
    assert data["encoding"] == "f32"
    assert [e["index"] for e in data["examples"]] == list(range(DEFAULT_EXAMPLES))
    assert sorted(maps["example"].unique()) == list(range(DEFAULT_EXAMPLES))
    checked = 0
    for example in data["examples"]:
        assert [v["name"] for v in example["views"]] == ["encoder_self", "decoder_self", "cross"]
        for view in example["views"]:
            layers, heads, queries, keys = view["shape"]
            assert (layers, heads) == (2, 4)
            rows = maps[(maps["example"] == example["index"]) & (maps["view"] == view["name"])
                        & (maps["measure"] == "weights")]
            assert len(rows) == layers * heads * queries * keys
            grid = np.full((layers, heads, queries, keys), np.nan)
            grid[rows["layer"], rows["head"], rows["query"], rows["key"]] = rows["value"]
            np.testing.assert_array_equal(f32(view["measures"]["weights"], view["shape"]), grid)
            first = rows[(rows["layer"] == 0) & (rows["head"] == 0)]
            # the CSV holds the tokens, the page draws their spaces visible
            assert [visible_token(t) for t in first.drop_duplicates("query")["query_token"]
                    ] == view["queries"]
            assert [visible_token(t) for t in first.drop_duplicates("key")["key_token"]
                    ] == view["keys"]
            assert view["sites"] == list(dict.fromkeys(rows["site"]))
            # a healthy masked softmax: nothing flagged on the map
            assert view["masked_cells"] == [] and view["failing_rows"] == []
            checked += 1
    assert checked == 3 * DEFAULT_EXAMPLES


def mean_max_weight_head(frame: pd.DataFrame, view: str) -> tuple[tuple[int, int], float]:
    """From the maps' CSV rows, by hand: the (layer, head) of ``view`` with the highest mean
    over every example's query rows of the row's largest weight (the first on a tie), and
    that mean."""
    rows = frame[(frame["view"] == view) & (frame["measure"] == "weights")]
    best, top = (0, 0), -np.inf
    for layer, head in sorted(set(zip(rows["layer"], rows["head"], strict=True))):
        one = rows[(rows["layer"] == layer) & (rows["head"] == head)]
        peaks = [one[one["example"] == e].pivot(index="query", columns="key",
                                                 values="value").to_numpy().max(1)
                 for e in sorted(set(one["example"]))]
        mean = float(np.concatenate(peaks).mean())
        if mean > top:
            best, top = (int(layer), int(head)), mean
    return best, top


def test_the_page_opens_on_the_most_concentrated_cross_attention_head(bart_report):
    data = page_data((bart_report / "index.html").read_text(encoding="utf-8"))
    maps = pd.read_csv(bart_report / data["csv"], keep_default_na=False,
                       dtype={"query_token": str, "key_token": str})
    maps = maps[maps["example"].isin([e["index"] for e in data["examples"]])]
    (layer, head), value = mean_max_weight_head(maps, "cross")
    opening = data["opening"]
    assert opening.pop("value") == pytest.approx(value, rel=1e-6)
    assert opening.pop("reason").startswith("the most concentrated (the highest mean max weight")
    assert opening == {"example": 0, "view": 2, "layer": layer, "head": head, "step": 0,
                       "key": 0, "statistic": "mean max weight"}
    assert {v["name"]: v["axes"] for v in data["examples"][0]["views"]} == {
        "encoder_self": ["source tokens", "source tokens"],
        "decoder_self": ["emitted steps", "decoder inputs"],
        "cross": ["emitted steps", "source tokens"]}


def test_the_csv_maps_are_the_models_own_attention(bart_report):
    transformers = pytest.importorskip("transformers")
    from attnaudit_examples.date_transformer.model import MAX_NEW_TOKENS, MODEL_DIR
    from attnaudit_examples.date_transformer.target import AUDIT_TSV

    tokenizer = transformers.AutoTokenizer.from_pretrained(MODEL_DIR)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(
        MODEL_DIR, attn_implementation="eager").eval()
    maps = pd.read_csv(bart_report / "attention_maps.csv", keep_default_na=False,
                       dtype={"query_token": str, "key_token": str})
    sources = [line.split("\t")[0] for line in
               AUDIT_TSV.read_text(encoding="utf-8").splitlines()[:DEFAULT_EXAMPLES]]
    for index, source in enumerate(sources):
        ids = tokenizer(source, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                                 num_beams=1)
            mine = maps[maps["example"] == index]
            steps = mine[mine["view"] == "cross"]["query"].max() + 1
            truth = model(input_ids=ids, decoder_input_ids=out[:, :steps],
                          output_attentions=True)
        for view, attentions in (("encoder_self", truth.encoder_attentions),
                                 ("decoder_self", truth.decoder_attentions),
                                 ("cross", truth.cross_attentions)):
            rows = mine[(mine["view"] == view) & (mine["measure"] == "weights")]
            expected = torch.stack(attentions)[:, 0].numpy()  # (layers, heads, Q, K)
            got = np.full(expected.shape, np.nan)
            got[rows["layer"], rows["head"], rows["query"], rows["key"]] = rows["value"]
            np.testing.assert_allclose(got, expected, atol=2e-5, err_msg=f"{index} {view}")
        keys = mine[mine["view"] == "cross"].drop_duplicates("key")["key_token"].tolist()
        assert keys == tokenizer.convert_ids_to_tokens(ids[0])
        # a step is labelled by the token it emits; a decoder key by the input it holds
        decoder = mine[mine["view"] == "decoder_self"]
        emitted = tokenizer.convert_ids_to_tokens(out[0, 1:steps + 1])
        assert decoder.drop_duplicates("query")["query_token"].tolist() == emitted
        assert decoder.drop_duplicates("key")["key_token"].tolist() == [
            START_LABEL, *emitted[:-1]]


def test_only_the_first_examples_are_kept_across_batches():
    from attnaudit_examples.date_transformer.model import MODEL_DIR
    from attnaudit_examples.date_transformer.target import AUDIT_TSV

    target = attnaudit.from_hf(MODEL_DIR, AUDIT_TSV, batch_size=2, max_new_tokens=12)
    texts = [t for b in target.iter_batches(5) for t in b.texts]
    audit = run_validity_audit(target, limit=5, progress=False, timing=False, regions=False,
                               keep_examples=3)
    assert [e.index for e in audit.kept_examples] == [0, 1, 2]
    assert [e.source for e in audit.kept_examples] == texts[:3]
    assert audit.example is audit.kept_examples[0]
    every = run_validity_audit(target, limit=BART_LIMIT, progress=False, timing=False,
                               regions=False, keep_examples=100)
    assert len(every.kept_examples) == BART_LIMIT  # all there is, no more
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="keep_examples"):
            run_validity_audit(target, limit=2, progress=False, keep_examples=bad)


def _record(weights: torch.Tensor, mask: torch.Tensor | None, name: str = "attn:self"
            ) -> AttentionRecord:
    record = AttentionRecord(Site(name, "self", "softmax", "attn"))
    record.append(AttentionCall(weights, mask_source=None if mask is None else lambda: mask))
    return record


def test_masked_mass_and_bad_row_sums_are_flagged_on_the_map():
    # batch 1, 2 heads, 3 queries, 4 keys; key 3 is padding (masked)
    weights = torch.full((1, 2, 3, 4), 1 / 3)
    weights[..., 3] = 0.0
    weights[0, 1, 2] = torch.tensor([0.3, 0.3, 0.2, 0.2])  # 0.2 on the masked key
    weights[0, 0, 1] = torch.tensor([0.5, 0.5, 0.5, 0.0])  # sums to 1.5
    mask = torch.tensor([True, True, True, False])
    data = page_data(attnaudit.show(_record(weights, mask), list("abcd")).html)
    (view,) = data["examples"][0]["views"]
    assert view["masked_cells"] == [[0, 1, 2, 3]]
    failing = {(r["head"], r["query"]): r for r in view["failing_rows"]}
    assert set(failing) == {(1, 2), (0, 1)}
    assert failing[(1, 2)]["checks"] == ["masked mass"]
    assert failing[(1, 2)]["masked_mass"] == pytest.approx(0.2)
    assert failing[(0, 1)]["checks"] == ["row sum"]
    assert failing[(0, 1)]["row_sum"] == pytest.approx(1.5)
    bits = np.unpackbits(np.frombuffer(base64.b64decode(view["ineligible"]["bits"]),
                                       dtype=np.uint8))[:2 * 3 * 4].reshape(1, 2, 3, 4)
    expected = np.broadcast_to(~mask.numpy(), (1, 2, 3, 4))
    np.testing.assert_array_equal(bits.astype(bool), expected)
    assert view["queries"] == ["0", "1", "2"]  # 3 queries, 4 tokens: by position
    assert view["keys"] == list("abcd")
    # the page opens on the first finding: the masked key that received weight
    assert {k: data["opening"][k] for k in ("example", "view", "layer", "head", "step", "key")
            } == {"example": 0, "view": 0, "layer": 0, "head": 1, "step": 2, "key": 3}
    assert data["opening"]["reason"] == "an ineligible key that received weight"


def test_a_bare_capture_with_an_extra_measure():
    torch.manual_seed(0)
    module = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(3, 5, 8)
    with torch.no_grad(), attnaudit.capture(module) as cap:
        _, reference = module(x, x, x, average_attn_weights=False)
    tokens = ["the", "cat", " sat", "<pad>", "&<b>"]
    norms = {cap.sites[0]: np.arange(5 * 5, dtype=np.float32).reshape(1, 5, 5) - 3.0}
    page = attnaudit.show(cap, tokens, example=2, measures={"value_norm": norms})
    assert page._repr_html_().startswith('<iframe class="attnaudit-explorer"')
    assert "srcdoc=" in page._repr_html_() and "<script>" not in page._repr_html_()
    data = page_data(page.html)
    (view,) = data["examples"][0]["views"]
    assert view["keys"] == ["the", "cat", "␣sat", "<pad>", "&<b>"]
    assert view["queries"] == view["keys"]
    np.testing.assert_allclose(f32(view["measures"]["weights"], view["shape"])[0],
                               reference[2].numpy(), atol=1e-6)
    extra = f32(view["measures"]["value_norm"], view["shape"])
    assert extra.shape == (1, 1, 5, 5)
    np.testing.assert_array_equal(extra[0], norms[cap.sites[0]])
    # cross-attention: keys by the tokens, queries by query_tokens
    with torch.no_grad(), attnaudit.capture(module) as crossed:
        module(x[:, :3], x, x)
    (view,) = page_data(attnaudit.show(crossed, tokens, query_tokens=list("xyz")).html
                        )["examples"][0]["views"]
    assert (view["name"], view["title"]) == ("cross", "cross-attention")
    assert view["queries"] == list("xyz") and view["shape"] == [1, 2, 3, 5]
    with pytest.raises(ExplorerError, match="example 3"):
        attnaudit.show(cap, example=3)
    with pytest.raises(ExplorerError, match="value_norm"):
        attnaudit.show(cap, measures={"value_norm": {cap.sites[0]: np.zeros((2, 5, 4))}})
    with pytest.raises(ExplorerError, match="Capture"):
        attnaudit.show(torch.zeros(2, 2))
    with pytest.raises(ExplorerError, match="nothing was captured"):
        attnaudit.show({})


def test_eight_bit_maps_are_within_half_a_step():
    gen = np.random.default_rng(0)
    array = gen.normal(size=(2, 3, 7, 9)).astype(np.float32)
    array[1, 2, 3, 4] = np.nan
    array[0, 1] = 0.25  # a constant map
    back = decode(encode(array, "u8"), [2, 3, 7, 9])
    assert np.isnan(back[1, 2, 3, 4]) and np.isnan(back).sum() == 1
    spread = np.nanmax(array, axis=(2, 3)) - np.nanmin(array, axis=(2, 3))
    half_step = (spread / 254 / 2)[:, :, None, None] + 1e-6
    assert (np.abs(np.nan_to_num(back - array)) <= half_step).all()
    np.testing.assert_array_equal(back[0, 1], 0.25)
    np.testing.assert_array_equal(decode(encode(array, "f32"), [2, 3, 7, 9]), array)


def test_the_notebook_view_of_an_audit_holds_the_explorer():
    from attnaudit.targets.loading import load_target

    audit = attnaudit.audit(load_target(None), limit=3, interventions=False, progress=False,
                            explorer_examples=2)
    html = audit._repr_html_()
    assert "Valid weighted retrieval computation?" in html
    assert html.count('<iframe class="attnaudit-explorer"') == 1
    data = page_data(audit.show().html)
    assert [e["index"] for e in data["examples"]] == [0, 1]
    with pytest.raises(attnaudit.TargetError, match="explorer_examples"):
        attnaudit.audit(load_target(None), limit=2, explorer_examples=0, progress=False)
    checks = attnaudit.audit(load_target(None), limit=2, checks_only=True, progress=False)
    assert "<iframe" not in checks._repr_html_()
    with pytest.raises(attnaudit.AttnauditError, match="kept no example maps"):
        checks.show()


def test_a_decoder_only_model_shows_its_prompt_and_continuation(tmp_path):
    transformers = pytest.importorskip("transformers")
    from attnaudit.report.explorer import explorer_views, maps_frame, payload
    from tests.helpers.tiny_hf import VOCAB, save_checkpoint

    config = transformers.GPT2Config(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2,
                                     pad_token_id=0, n_positions=32, n_embd=32, n_layer=2,
                                     n_head=4, initializer_range=0.3)
    save_checkpoint(transformers.GPT2LMHeadModel, config, tmp_path, eos_after=False)
    prompts = ["w5 w6 w7 w8 w9", "w10 w11"]
    target = attnaudit.from_hf(tmp_path, prompts, max_new_tokens=4)
    audit = run_validity_audit(target, progress=False, timing=False, regions=False,
                               keep_examples=2)
    examples = explorer_views(audit.kept_examples)
    for example, prompt in zip(examples, prompts, strict=True):
        titles = {v.name: v.title for v in example.views}
        assert titles == {"decoder_self": "continuation over itself",
                          "cross": "continuation over the prompt"}
        cross = next(v for v in example.views if v.name == "cross")
        assert cross.measures["weights"].shape[:2] == (2, 4)
        assert len(cross.key_labels) == len(prompt.split())  # the prompt's real tokens
        np.testing.assert_allclose(cross.measures["weights"].sum(-1), 1.0, atol=1e-5)
        assert cross.axes == ("continuation steps", "prompt tokens")
    frame = maps_frame(examples)
    assert set(frame["view"]) == {"decoder_self", "cross"}
    assert len(frame) == sum(a.size for e in examples for v in e.views
                             for a in v.measures.values())
    # the page opens on the continuation over the prompt, at its most concentrated head
    opening = payload(examples, max_masked_mass=None, row_sum_tolerance={})["opening"]
    (layer, head), value = mean_max_weight_head(frame, "cross")
    assert [v.name for v in examples[0].views][opening["view"]] == "cross"
    assert (opening["layer"], opening["head"]) == (layer, head)
    assert opening["value"] == pytest.approx(value, rel=1e-6)
