"""Expected-key builders and the Pharaoh reader, against hand cases and set-based references."""

from __future__ import annotations

import itertools
import random
import re

import pytest
import torch

from attnaudit.analysis.expectations import (
    char_offsets,
    expected_from_callable,
    expected_from_spans,
    keys_from_char_spans,
    read_pharaoh,
)

# "Hello, world" as a fast tokenizer with <s> ... </s> reports it (specials are (0, 0))
TEXT = "Hello, world"
OFFSETS = [(0, 0), (0, 5), (5, 6), (7, 12), (0, 0)]


def reference(offsets, spans, n_keys):
    """Token k is expected when the sets of characters it and a span cover intersect."""
    out = [False] * n_keys
    for k, (ts, te) in enumerate(offsets):
        chars = set(range(ts, te))
        out[k] = any(chars & set(range(s, e)) for s, e in spans)
    return out


def test_char_offsets():
    assert char_offsets("abc") == [(0, 1), (1, 2), (2, 3)]
    assert char_offsets("") == []


@pytest.mark.parametrize(("spans", "want"), [
    ([(7, 12)], [False, False, False, True, False, False]),  # "world"
    ([(3, 6)], [False, True, True, False, False, False]),  # "lo," straddles two tokens
    ([(6, 7)], [False] * 6),  # the space between tokens belongs to none
    ([(5, 5)], [False] * 6),  # an empty span matches nothing
    ([(0, 1)], [False, True, False, False, False, False]),  # specials (0, 0) never match
    ([range(4, 8), (11, 30)], [False, True, True, True, False, False]),
    ([], [False] * 6),
])
def test_hand_cases(spans, want):
    got = keys_from_char_spans(OFFSETS, spans, 6)
    assert got.dtype == torch.bool and got.tolist() == want
    assert want == reference(OFFSETS, [(s.start, s.stop) if isinstance(s, range) else s
                                       for s in spans], 6)


def test_tensor_offsets_and_random_texts_match_reference():
    rng = random.Random(0)
    for _ in range(50):
        n = rng.randrange(0, 12)
        cuts = sorted(rng.sample(range(1, 30), n + 1))
        offsets = [(0, 0)] + [(a, b) for a, b in itertools.pairwise(cuts)]
        spans = []
        for _ in range(rng.randrange(0, 3)):
            s = rng.randrange(0, 32)
            spans.append((s, s + rng.randrange(0, 5)))
        n_keys = len(offsets) + rng.randrange(0, 3)
        want = reference(offsets, spans, n_keys)
        assert keys_from_char_spans(offsets, spans, n_keys).tolist() == want
        assert keys_from_char_spans(torch.tensor(offsets).reshape(-1, 2), spans,
                                    n_keys).tolist() == want


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="n_keys=4"):
        keys_from_char_spans(OFFSETS, [(0, 1)], 4)
    with pytest.raises(ValueError, match="start <= end"):
        keys_from_char_spans(OFFSETS, [(5, 2)], 6)
    with pytest.raises(ValueError, match="pair"):
        keys_from_char_spans(OFFSETS, [(1, 2, 3)], 6)
    with pytest.raises(ValueError, match="step 1"):
        keys_from_char_spans(OFFSETS, [range(0, 6, 2)], 6)


def test_batched_and_callable():
    sources = ["may 17, 1971", "3 june 2004", "12/01/1999"]
    offsets = [char_offsets(s) for s in sources]
    n_keys = 13
    spans = [[(len(s) - 4, len(s))] for s in sources]
    got = expected_from_spans(offsets, spans, n_keys)
    assert got.shape == (3, n_keys) and got.dtype == torch.bool
    for row, s in enumerate(sources):
        want = [len(s) - 4 <= k < len(s) for k in range(n_keys)]
        assert got[row].tolist() == want

    def digits(text):
        return [m.span() for m in re.finditer(r"\d+", text)]

    got = expected_from_callable(sources, digits, offsets, n_keys)
    for row, s in enumerate(sources):
        assert got[row].tolist() == [k < len(s) and s[k].isdigit() for k in range(n_keys)]
    assert expected_from_spans([], [], 5).shape == (0, 5)
    assert expected_from_callable([], digits, [], 5).shape == (0, 5)
    with pytest.raises(ValueError, match="2 offset lists but 1"):
        expected_from_spans(offsets[:2], spans[:1], n_keys)
    with pytest.raises(ValueError, match="3 sources but 2"):
        expected_from_callable(sources, digits, offsets[:2], n_keys)


def test_read_pharaoh_lines_and_file(tmp_path):
    lines = ["0-0 1?1 2-3 2?2", "", "  3-1\t0?0  "]
    path = tmp_path / "gold.wa"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    for got in (read_pharaoh(lines), read_pharaoh(path), read_pharaoh(str(path))):
        assert got == [
            ({(0, 0), (2, 3)}, {(0, 0), (2, 3), (1, 1), (2, 2)}),
            (set(), set()),
            ({(3, 1)}, {(3, 1), (0, 0)}),
        ]
        for sure, possible in got:
            assert sure <= possible
    # (source i, target j): "1-0" means source word 1 aligns to target word 0
    assert read_pharaoh(["1-0"]) == [({(1, 0)}, {(1, 0)})]


@pytest.mark.parametrize("bad", ["0-1 x", "0--1", "1-", "-1-2", "0:1", "1p2"])
def test_read_pharaoh_rejects_malformed(bad):
    with pytest.raises(ValueError, match="line 2"):
        read_pharaoh(["0-0", bad])
