"""AlignmentAnalyser: corpus AER / precision / recall against a hand example and plain loops."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnaudit.analysis.alignment import AlignmentAnalyser
from attnaudit.analysis.expectations import read_pharaoh
from attnaudit.record import AttentionCall, AttentionRecord, Site

SITE = "model.decoder.layers.3.encoder_attn:cross"


def make_record(weights, name: str = SITE) -> AttentionRecord:
    record = AttentionRecord(Site(name, "cross", "tap", "model"))
    record.append(AttentionCall(weights=torch.as_tensor(weights)))
    return record


def reference_counts(weights, gold, src_ids, tgt_ids):
    """Plain loops. weights (B, H, Q, K). -> {head: [n, |A&S|, |A&P|, |A|, |S|]}, head -1 =
    argmax links of the head-averaged weights; an example with a non-finite weight on a
    used row x key is skipped for that head."""
    b_n, h_n, q_n, k_n = weights.shape
    out = {h: [0, 0, 0, 0, 0] for h in [*range(h_n), -1]}
    for b in range(b_n):
        sure, possible = gold[b]
        possible = set(possible) | set(sure)
        src = list(src_ids[b]) + [None] * (k_n - len(src_ids[b]))
        tgt = list(tgt_ids[b]) + [None] * (q_n - len(tgt_ids[b]))
        src_words = sorted({w for w in src if w is not None})
        tgt_words = sorted({w for w in tgt if w is not None})
        for h in out:
            if h == -1:
                w = [[sum(float(weights[b, g, q, k]) for g in range(h_n)) / h_n
                      for k in range(k_n)] for q in range(q_n)]
            else:
                w = [[float(weights[b, h, q, k]) for k in range(k_n)] for q in range(q_n)]
            used = [w[q][k] for q in range(q_n) for k in range(k_n)
                    if tgt[q] is not None and src[k] is not None]
            if not all(np.isfinite(used)):
                continue
            links = set()
            for j in tgt_words:
                rows = [q for q in range(q_n) if tgt[q] == j]
                best, best_score = None, None
                for i in src_words:
                    score = sum(sum(w[q][k] for k in range(k_n) if src[k] == i)
                                for q in rows) / len(rows)
                    if best is None or score > best_score:
                        best, best_score = i, score
                if best is not None:
                    links.add((best, j))
            counts = out[h]
            counts[0] += 1
            counts[1] += len(links & set(sure))
            counts[2] += len(links & possible)
            counts[3] += len(links)
            counts[4] += len(sure)
    return out


def check(analyser, ref, site=SITE):
    counts = analyser.counts()
    counts = counts[counts["site"] == site].set_index("head")
    assert set(counts.index) == set(ref)
    frame = analyser.compute()
    frame = frame[frame["site"] == site].set_index(["head", "metric"])
    for head, (n, a_s, a_p, a, s) in ref.items():
        assert counts.loc[head, ["n", "a_and_s", "a_and_p", "a", "s"]].tolist() == [
            n, a_s, a_p, a, s]
        if a + s:
            assert frame.loc[(head, "aer"), "value"] == pytest.approx(1 - (a_s + a_p) / (a + s))
            assert frame.loc[(head, "aer"), "n_links"] == a + s
        if a:
            assert frame.loc[(head, "precision"), "value"] == pytest.approx(a_p / a)
        if s:
            assert frame.loc[(head, "recall"), "value"] == pytest.approx(a_s / s)
    assert frame["value"].notna().all()


# Hand example. Keys: w0, w1a, w1b, w2, </s> -> source word ids [0, 1, 1, 2, None].
# Rows: t0, t1a, t1b, t2, </s> -> target word ids [0, 1, 1, 2, None].
HAND = [[[
    [0.30, 0.05, 0.05, 0.10, 0.50],  # t0: </s> key is the top weight but is not a word;
                                     #     words: w0 .30, w1 .10, w2 .10 -> link (0, 0)
    [0.10, 0.15, 0.15, 0.50, 0.10],  # t1a: w0 .10, w1 .30, w2 .50
    [0.10, 0.35, 0.35, 0.10, 0.10],  # t1b: w0 .10, w1 .70, w2 .10
                                     # t1 = mean(t1a, t1b): w0 .10, w1 .50, w2 .30 -> (1, 1)
    [0.05, 0.25, 0.25, 0.40, 0.05],  # t2: w1 = .25 + .25 = .50 beats w2 .40 -> (1, 2)
    [0.00, 0.00, 0.00, 0.00, 1.00],  # </s> row: dropped
]]]
# Gold "0-0 2-2 1?1": S = {(0,0), (2,2)}, P = S + {(1,1)}; A = {(0,0), (1,1), (1,2)}.
# |A&S| = 1, |A&P| = 2, |A| = 3, |S| = 2
# AER = 1 - (1 + 2) / (3 + 2) = 0.4; precision = 2 / 3; recall = 1 / 2.
HAND_SRC = [[0, 1, 1, 2, None]]
HAND_TGT = [[0, 1, 1, 2, None]]


def test_hand_worked_example():
    analyser = AlignmentAnalyser()
    analyser.update(make_record(torch.tensor(HAND)), gold=read_pharaoh(["0-0 2-2 1?1"]),
                    src_word_ids=HAND_SRC, tgt_word_ids=HAND_TGT)
    frame = analyser.compute().set_index(["head", "metric"])
    assert frame.loc[(0, "aer"), "value"] == pytest.approx(0.4)
    assert frame.loc[(0, "precision"), "value"] == pytest.approx(2 / 3)
    assert frame.loc[(0, "recall"), "value"] == pytest.approx(0.5)
    assert frame.loc[(0, "aer"), "n_links"] == 5
    assert frame.loc[(0, "aer"), "n"] == 1
    # one head: the head average (head -1) is the same
    assert frame.loc[(-1, "aer"), "value"] == pytest.approx(0.4)
    assert set(frame["layer"]) == {3} and set(frame["kind"]) == {"cross"}
    ref = reference_counts(np.array(HAND), read_pharaoh(["0-0 2-2 1?1"]), HAND_SRC, HAND_TGT)
    assert ref[0] == [1, 1, 2, 3, 2]
    # a bare set is sure = possible: A&S = A&P = {(0,0), (1,1)}, |A| = 3, |S| = 2
    # -> AER = 1 - (2 + 2) / (3 + 2) = 0.2
    bare = AlignmentAnalyser()
    bare.update(make_record(torch.tensor(HAND)), gold=[{(0, 0), (1, 1)}],
                src_word_ids=HAND_SRC, tgt_word_ids=HAND_TGT)
    assert bare.compute().set_index(["head", "metric"]).loc[(0, "aer"), "value"] == \
        pytest.approx(0.2)
    # numpy integer word ids read the same as ints
    as_numpy = AlignmentAnalyser()
    as_numpy.update(make_record(torch.tensor(HAND)), gold=read_pharaoh(["0-0 2-2 1?1"]),
                    src_word_ids=[[None if w is None else np.int64(w) for w in HAND_SRC[0]]],
                    tgt_word_ids=HAND_TGT)
    assert as_numpy.compute().equals(analyser.compute())


def random_corpus(seed, b=5, h=3, q=7, k=8):
    rng = np.random.default_rng(seed)
    weights = rng.dirichlet(np.ones(k) * 0.5, size=(b, h, q))
    gold, src_ids, tgt_ids = [], [], []
    for _ in range(b):
        n_src = rng.integers(1, k - 1)  # tokens carrying words; then </s>, then padding
        src = sorted(rng.integers(0, 4, size=n_src).tolist())
        src = [*src, None]
        n_tgt = rng.integers(1, q)
        tgt = [None, *sorted(rng.integers(0, 4, size=n_tgt).tolist())]
        tgt = [*tgt[: q - 1], None]
        src_words = sorted({w for w in src if w is not None})
        tgt_words = sorted({w for w in tgt if w is not None})
        links = [(i, j) for i in src_words for j in tgt_words]
        chosen = [links[x] for x in rng.permutation(len(links))[: rng.integers(0, 5)]]
        sure = set(chosen[: len(chosen) // 2 + 1]) if chosen else set()
        possible = set(chosen)
        gold.append((sure, possible))
        src_ids.append(src)
        tgt_ids.append(tgt)
    return weights, gold, src_ids, tgt_ids


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_corpus_matches_reference(seed):
    weights, gold, src_ids, tgt_ids = random_corpus(seed)
    analyser = AlignmentAnalyser()
    analyser.update(make_record(torch.from_numpy(weights)), gold=gold, src_word_ids=src_ids,
                    tgt_word_ids=tgt_ids)
    check(analyser, reference_counts(weights, gold, src_ids, tgt_ids))


def test_merge_of_shards_equals_one_shot():
    weights, gold, src_ids, tgt_ids = random_corpus(7, b=6)
    whole, first, second = AlignmentAnalyser(), AlignmentAnalyser(), AlignmentAnalyser()
    w = torch.from_numpy(weights)
    whole.update(make_record(w), gold=gold, src_word_ids=src_ids, tgt_word_ids=tgt_ids)
    first.update(make_record(w[:4]), gold=gold[:4], src_word_ids=src_ids[:4],
                 tgt_word_ids=tgt_ids[:4])
    second.update(make_record(w[4:]), gold=gold[4:], src_word_ids=src_ids[4:],
                  tgt_word_ids=tgt_ids[4:])
    merged = first.merge(second)
    assert merged.counts().equals(whole.counts())
    assert merged.compute().equals(whole.compute())
    check(merged, reference_counts(weights, gold, src_ids, tgt_ids))
    whole.reset()
    assert whole.compute().empty


def test_non_finite_example_is_skipped_for_that_head_only():
    weights, gold, src_ids, tgt_ids = random_corpus(3)
    first_word_row = next(q for q, w in enumerate(tgt_ids[1]) if w is not None)
    weights[1, 2, first_word_row, 0] = np.nan  # head 2, a used row x key
    weights[0, 0, -1, 0] = np.inf  # an EOS row: not used, harmless
    analyser = AlignmentAnalyser()
    analyser.update(make_record(torch.from_numpy(weights)), gold=gold, src_word_ids=src_ids,
                    tgt_word_ids=tgt_ids)
    ref = reference_counts(weights, gold, src_ids, tgt_ids)
    assert ref[2][0] == 4 and ref[-1][0] == 4 and ref[0][0] == ref[1][0] == 5
    check(analyser, ref)


def test_empty_batch_and_zero_denominators_give_no_rows():
    analyser = AlignmentAnalyser()
    analyser.update(make_record(torch.zeros(0, 2, 3, 4)), gold=[], src_word_ids=[],
                    tgt_word_ids=[])
    assert analyser.compute().empty
    # no target words and no gold links: |A| = |S| = 0 -> rows omitted, never NaN
    analyser.update(make_record(torch.full((1, 1, 2, 2), 0.5), name="other"),
                    gold=[(set(), set())], src_word_ids=[[0, None]], tgt_word_ids=[[None]])
    assert analyser.compute().empty
    # gold links but no predicted links (no target words, strict off): recall 0 and AER 1
    # are emitted; precision (|A| = 0) is omitted
    loose = AlignmentAnalyser(strict=False)
    loose.update(make_record(torch.full((1, 1, 2, 2), 0.5)), gold=[({(0, 0)}, {(0, 0)})],
                 src_word_ids=[[0, None]], tgt_word_ids=[[None, None]])
    frame = loose.compute().set_index(["head", "metric"])
    assert set(frame.index) == {(0, "aer"), (0, "recall"), (-1, "aer"), (-1, "recall")}
    assert frame.loc[(0, "aer"), "value"] == 1.0 and frame.loc[(0, "recall"), "value"] == 0.0


def test_mismatches_raise_clear_errors():
    analyser = AlignmentAnalyser()
    record = make_record(torch.tensor(HAND))
    gold = read_pharaoh(["0-0"])
    with pytest.raises(ValueError, match=r"encoder_attn.*\(1, 1, 5, 5\).*2/1/1"):
        analyser.update(record, gold=gold * 2, src_word_ids=HAND_SRC, tgt_word_ids=HAND_TGT)
    with pytest.raises(ValueError, match=r"6 source word ids.*length 5"):
        analyser.update(record, gold=gold, src_word_ids=[[0] * 6], tgt_word_ids=HAND_TGT)
    with pytest.raises(ValueError, match=r"6 target word ids.*length 5"):
        analyser.update(record, gold=gold, src_word_ids=HAND_SRC, tgt_word_ids=[[0] * 6])
    with pytest.raises(ValueError, match="word id -1"):
        analyser.update(record, gold=gold, src_word_ids=[[0, -1]], tgt_word_ids=HAND_TGT)
    # a gold link to a word no key carries: likely 1-based indices
    with pytest.raises(ValueError, match=r"\(3, 1\).*strict=False"):
        analyser.update(record, gold=read_pharaoh(["3-1"]), src_word_ids=HAND_SRC,
                        tgt_word_ids=HAND_TGT)
    assert analyser.compute().empty
    # a failing example leaves no partial counts behind
    analyser.update(record, gold=gold, src_word_ids=HAND_SRC, tgt_word_ids=HAND_TGT)
    before = analyser.counts()
    with pytest.raises(ValueError, match="example 1"):
        analyser.update(make_record(torch.tensor(HAND * 2)), gold=gold * 2,
                        src_word_ids=[HAND_SRC[0], [0, -1]], tgt_word_ids=HAND_TGT * 2)
    assert analyser.counts().equals(before)
    other = make_record(torch.full((1, 2, 5, 5), 0.2))
    with pytest.raises(ValueError, match="had 1 heads, now 2"):
        analyser.update(other, gold=gold, src_word_ids=HAND_SRC, tgt_word_ids=HAND_TGT)
    with pytest.raises(TypeError):
        analyser.merge(object())  # type: ignore[arg-type]
