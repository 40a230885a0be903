"""A long prompt's explorer data against the model's own eager attentions: the block means
of ``attention_maps.csv`` and the exact top keys and key-0 weights of
``attention_top_keys.csv``, for every layer, head and continuation step of a 4,096-token
prompt (a tiny GPT-2), computed here with numpy from ``output_attentions=True`` (each row
renormalised over the prompt, as the prompt view is)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.long_prompt import NEW_TOKENS, PROMPT_TOKENS, long_prompt_report

BLOCK = 32  # 4,096 keys in 128 blocks (at most 128 blocks of a power of two)
TOLERANCE = {"rtol": 1e-4, "atol": 1e-7}  # float32 passes: the audit's and this eager one


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return long_prompt_report(tmp_path_factory)


def test_the_overview_holds_the_mean_of_each_block_of_prompt_tokens(report):
    layers, heads, steps, keys = report.rows.shape
    assert (keys, steps) == (PROMPT_TOKENS, NEW_TOKENS)
    cross = report.maps[(report.maps["view"] == "cross") & (report.maps["measure"] == "weights")]
    got = np.full((layers, heads, steps, keys // BLOCK), np.nan)
    got[cross["layer"], cross["head"], cross["query"], cross["key"]] = cross["value"]
    expected = report.rows.reshape(layers, heads, steps, keys // BLOCK, BLOCK).mean(-1)
    assert len(cross) == got.size
    np.testing.assert_allclose(got, expected, **TOLERANCE)
    first = cross[cross["key"] == 1]["key_token"].iloc[0]
    assert first.count("…") == 1  # a block reads first…last


def test_every_row_keeps_its_exact_top_keys_and_key_0(report):
    layers, heads, steps, _ = report.rows.shape
    tops = report.tops[report.tops["view"] == "cross"]
    top = tops[tops["kind"] == "top"].sort_values(["layer", "head", "query", "rank"])
    k = int(top["rank"].max()) + 1
    assert k == 8 and len(top) == layers * heads * steps * k
    keys_kept = top["key"].to_numpy().reshape(layers, heads, steps, k)
    values = top["value"].to_numpy().reshape(layers, heads, steps, k)
    # each kept key's weight is the model's, the kept weights are the row's k largest
    np.testing.assert_allclose(values, np.take_along_axis(report.rows, keys_kept, -1),
                               **TOLERANCE)
    np.testing.assert_allclose(values, -np.sort(-report.rows, -1)[..., :k], **TOLERANCE)
    assert (np.diff(values, axis=-1) <= 0).all()
    assert (top["block"] == top["key"] // BLOCK).all()
    first = tops[tops["kind"] == "key 0"].sort_values(["layer", "head", "query"])
    assert (first["key"] == 0).all() and len(first) == layers * heads * steps
    np.testing.assert_allclose(first["value"].to_numpy().reshape(layers, heads, steps),
                               report.rows[..., 0], **TOLERANCE)


def test_a_bare_capture_with_a_long_key_axis_keeps_its_top_keys_on_its_tokens():
    """``show()`` of a captured call over 1,000 keys, in bfloat16: block means and top keys
    against numpy, and the zoom's key labels are the tokens given."""
    import base64

    import torch

    import attnaudit
    from attnaudit.record import AttentionCall, AttentionRecord, Site
    from tests.helpers.report_page import page_data

    torch.manual_seed(5)
    keys = 1000
    weights = torch.softmax(4 * torch.randn(1, 2, 3, keys), -1).to(torch.bfloat16)
    record = AttentionRecord(Site("attn:self", "self", "softmax", "attn"))
    record.append(AttentionCall(weights))
    tokens = [f"k{i}" for i in range(keys)]
    (view,) = page_data(attnaudit.show(record, tokens).html)["examples"][0]["views"]
    w = weights[0].double().numpy()  # (H, 3, keys): bfloat16 values, exactly
    block = 8  # 1,000 keys: 125 blocks of 8
    long = view["long"]
    assert (long["block"], long["k"], long["tokens"][:2]) == (block, 8, ["k0", "k1"])
    means = np.frombuffer(base64.b64decode(view["measures"]["weights"]["data"]), "<f4")
    np.testing.assert_allclose(means.reshape(2, 3, keys // block),
                               w.reshape(2, 3, keys // block, block).mean(-1), rtol=1e-6)
    index = np.frombuffer(base64.b64decode(long["index"]), "<i4").reshape(2, 3, 8)
    value = np.frombuffer(base64.b64decode(long["value"]), "<f4").reshape(2, 3, 8)
    np.testing.assert_array_equal(value, np.take_along_axis(w, index, -1))
    np.testing.assert_array_equal(value, -np.sort(-w, -1)[..., :8])
    first = np.frombuffer(base64.b64decode(long["first"]), "<f4").reshape(2, 3)
    np.testing.assert_array_equal(first, w[..., 0])
