"""Word and span rollups: equal to hand sums over the tokens of each word or span, the three
word rules agree where they should, and bad spans are refused."""

from __future__ import annotations

import re

import pytest
import torch

from attnaudit.analysis import (
    aggregate,
    group_labels,
    keys_from_word_spans,
    span_groups,
    words_from_offsets,
    words_from_tokens,
)

TEXTS = ["the cat sat on the mat", "a dog, barking loudly", "cats and dogs"]


@pytest.fixture(scope="module")
def byte_bpe():
    """A byte-level BPE tokenizer (GPT-2 style 'Ġ' markers) trained offline on TEXTS."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=280, min_frequency=1,
                                                       initial_alphabet=pre_tokenizers
                                                       .ByteLevel.alphabet()))
    return tok


@pytest.fixture(scope="module")
def metaspace():
    """A SentencePiece-style word-piece tokenizer ('▁' markers) with small pieces."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=40, min_frequency=1))
    return tok


def hand_words(text: str, offsets: list[tuple[int, int]]) -> list[int]:
    """Per token the whitespace word holding its first non-space character, by regex."""
    spans = [m.span() for m in re.finditer(r"\S+", text)]
    out = []
    for start, end in offsets:
        first = next((i for i in range(start, end) if not text[i].isspace()), None)
        out.append(next((w for w, (s, e) in enumerate(spans) if first is not None
                         and s <= first < e), -1))
    return out


def test_word_sums_equal_a_hand_sum_over_each_words_tokens(byte_bpe):
    torch.manual_seed(0)
    for text in TEXTS:
        enc = byte_bpe.encode(text)
        assert len(enc.tokens) > len(text.split())  # words split into several tokens
        words = words_from_offsets(text, enc.offsets)
        assert words == hand_words(text, enc.offsets)
        weights = torch.softmax(torch.randn(2, 3, len(enc.tokens)), -1)
        rolled = aggregate(weights, words)
        n_words = len(text.split())
        assert rolled.shape == (2, 3, n_words)
        for w in range(n_words):
            tokens = [k for k, word in enumerate(words) if word == w]
            assert torch.allclose(rolled[..., w], weights[..., tokens].sum(-1))
            assert torch.allclose(aggregate(weights, words, reduce="max")[..., w],
                                  weights[..., tokens].max(-1).values)
            assert torch.allclose(aggregate(weights, words, reduce="mean")[..., w],
                                  weights[..., tokens].mean(-1))
        in_words = torch.tensor(words) >= 0  # a lone 'Ġ' (a space) is in no word
        assert torch.allclose(rolled.sum(-1), weights[..., in_words].sum(-1))  # mass kept
        assert group_labels(enc.tokens, words) == text.split()


@pytest.mark.parametrize("name", ["byte_bpe", "metaspace"])
def test_offsets_located_and_marker_rules_agree(name, request):
    tok = request.getfixturevalue(name)
    for text in TEXTS:
        enc = tok.encode(text)
        by_offsets = words_from_offsets(text, enc.offsets)
        tokens = [t.replace("Ġ", " ").replace("▁", " ") for t in enc.tokens]
        located, rule = words_from_tokens(enc.tokens, text=text)
        markers, marker_rule = words_from_tokens(enc.tokens)
        assert (rule, marker_rule) == ("located", "markers")
        assert by_offsets == located == markers, (text, tokens)


def test_rules_differ_where_the_text_tells_more_than_markers():
    # a whitespace-split vocabulary has no markers: each token is a word, while located
    # characters of a character-level tokenizer join into the text's words
    text = "3 may 2001"
    chars, rule = words_from_tokens(list(text), text=text)
    assert rule == "located" and chars == [0, -1, 1, 1, 1, -1, 2, 2, 2, 2]
    assert words_from_tokens(list(text))[0] == [0, -1, 1, 2, 3, -1, 4, 5, 6, 7]
    # a token missing from the text falls back to the marker rule
    assert words_from_tokens(["▁a", "b", "▁<unk>"], text="ab ?") == ([0, 0, 1], "markers")
    # left out tokens (padding, specials) belong to no word
    assert words_from_tokens(["<pad>", "w1", "w2", "</s>"], [0, 1, 1, 0], "w1 w2") == (
        [-1, 0, 1, -1], "located")


def test_span_rollups_equal_hand_sums_and_bad_spans_are_refused(byte_bpe):
    text = TEXTS[1]
    enc = byte_bpe.encode(text)
    torch.manual_seed(1)
    scores = torch.randn(4, len(enc.tokens))  # attributions: signed
    token_spans = [(0, 2), (3, len(enc.tokens))]
    groups = span_groups(len(enc.tokens), token_spans)
    rolled = aggregate(scores, groups)
    for index, (start, end) in enumerate(token_spans):
        assert torch.allclose(rolled[:, index], scores[:, start:end].sum(-1))
    char_spans = [(text.index("dog"), text.index("dog") + 3), (text.index("loudly"), len(text))]
    by_chars = span_groups(len(enc.tokens), char_spans, enc.offsets)
    for index, (start, end) in enumerate(char_spans):
        inside = [k for k, (s, e) in enumerate(enc.offsets) if max(s, start) < min(e, end)]
        assert inside and torch.allclose(aggregate(scores, by_chars)[:, index],
                                         scores[:, inside].sum(-1))
    # per-example maps, an empty group, and groups for (B, ..., keys)
    batched = aggregate(scores[:2, None], torch.stack([groups, by_chars]), 3, "max")
    assert batched.shape == (2, 1, 3) and batched[:, :, 2].isnan().all()
    assert aggregate(scores, groups, 3)[:, 2].eq(0).all()
    with pytest.raises(ValueError, match="overlap"):
        span_groups(5, [(0, 3), (2, 4)])
    with pytest.raises(ValueError, match="reduce must be"):
        aggregate(scores, groups, reduce="median")
    with pytest.raises(ValueError, match="groups"):
        aggregate(scores, groups[:-1])


def test_expected_keys_from_word_spans(byte_bpe):
    text = TEXTS[0]
    enc = byte_bpe.encode(text)
    words = words_from_offsets(text, enc.offsets)
    expected = keys_from_word_spans(words, [(1, 2), range(5, 6)], len(enc.tokens) + 2)
    wanted = [w in (1, 5) for w in words] + [False, False]  # 'cat', 'mat'; padding
    assert expected.tolist() == wanted and any(wanted)


def test_word_importance_table_of_a_character_model_equals_hand_sums():
    """The bundled date model's tokens are the characters of the text: each whitespace
    word's value is the sum over its characters' positions."""
    from attnaudit.analysis.words import word_importance_table
    from attnaudit.targets.loading import load_target

    target = load_target(None)
    batch = next(target.iter_batches(2))
    torch.manual_seed(2)
    n_steps = 3
    importances = {"saliency": torch.randn(2, n_steps, batch.source_ids.shape[1])}
    steps = torch.tensor([[True, True, False], [True, True, True]])
    emitted = torch.full((2, n_steps), 5)
    table = word_importance_table(target, batch, emitted, importances, steps)
    text = batch.texts[0]
    spans = [m.span() for m in re.finditer(r"\S+", text)]
    assert set(table["rule"]) == {"located"} and list(table["step"].unique()) == [0, 1]
    for row in table.itertuples(index=False):
        start, end = spans[row.word]
        assert row.word_text == text[start:end]
        assert row.value == pytest.approx(float(importances["saliency"][0, row.step,
                                                                        start:end].sum()))
    assert len(table) == 2 * len(spans)


def test_word_attention_of_words_of_several_tokens_is_the_sum_of_their_weights():
    """The report's word attention: per cross site and step, the heads' mean of the summed
    weights of each word's tokens (here words of 1, 3 and 2 tokens, and a special token)."""
    import numpy as np

    from attnaudit.analysis.example_maps import AttentionMap, ExampleMaps
    from attnaudit.analysis.words import word_attention_table

    rng = np.random.default_rng(0)
    tokens = ["<s>", "A", "b", "c", "d", "D", "e"]
    words = [-1, 0, 1, 1, 1, 2, 2]  # "A", "bcd", "De"
    weights = rng.dirichlet(np.ones(len(tokens)), size=(2, 3)).astype(np.float32)  # (H, Q, K)
    maps = {"dec.cross:cross": AttentionMap("dec.cross:cross", "cross", weights,
                                            ["x", "y", "z"], tokens),
            "enc.self:self": AttentionMap("enc.self:self", "encoder_self", weights,
                                          tokens[:3], tokens[:3])}
    example = ExampleMaps("A bcd De", tokens, ["x", "y", "z"], maps, words, "located")
    table = word_attention_table(example)
    assert set(table["site"]) == {"dec.cross:cross"} and len(table) == 3 * 3
    for row in table.itertuples(index=False):
        members = [i for i, w in enumerate(words) if w == row.word]
        expected = float(np.mean([weights[h, row.step, members].sum() for h in range(2)]))
        assert row.attention == pytest.approx(expected, rel=1e-6)
        assert row.word_text == ["A", "bcd", "De"][row.word]
