"""The long-prompt explorer's page budget: at 8,192 prompt tokens the page grows by a fixed
number of bytes per layer, head and continuation step (128 block means, 8 top keys and key
0, base64), measured here on small shapes, so that 16 layers x 32 heads x 32 steps stays
within 20 MB (``python -m benchmarks.long_prompt_page`` measures that shape itself)."""

from __future__ import annotations

import torch

from attnaudit.report.explorer import LONG_PAYLOAD_BUDGET
from benchmarks.long_prompt_page import page_bytes

PROMPT = 8192
# per (layer, head, step): 128 float32 block means + 8 int32 keys + 8 float32 weights +
# 1 float32 key-0 weight, base64 (4/3), and 128 ineligible bits
PER_ROW = (128 * 4 + 8 * 8 + 4) * 4 / 3 + 128 / 8 * 4 / 3


def test_the_page_grows_by_its_kept_numbers_per_layer_head_and_step():
    base = page_bytes(PROMPT, 1, 2, 2)
    more_steps = page_bytes(PROMPT, 1, 2, 4) - base  # 4 more (layer, head, step) rows
    more_heads = page_bytes(PROMPT, 1, 4, 2) - base  # 4 more
    more_layers = page_bytes(PROMPT, 2, 2, 2) - base  # 4 more, and a site name
    for grown in (more_steps, more_heads, more_layers):
        assert 4 * PER_ROW - 8 <= grown <= 4 * PER_ROW + 64, (grown, 4 * PER_ROW)
    fixed = base - 4 * PER_ROW  # the page's script, style, token labels
    assert fixed + 16 * 32 * 32 * (more_steps / 4) <= LONG_PAYLOAD_BUDGET


def test_a_bfloat16_model_gives_a_page_of_the_same_size():
    # the same numbers kept, as float32; only the printed opening statistic may differ
    half, full = page_bytes(2048, 1, 2, 3, torch.bfloat16), page_bytes(2048, 1, 2, 3)
    assert abs(half - full) <= 32, (half, full)
