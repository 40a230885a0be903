"""The chunk budget: sizes read off the model, chunks that follow the budget, results that do
not depend on it."""

from __future__ import annotations

import pytest
import torch

from attnaudit.capturing.blocks import parse_memory
from attnaudit.interventions.memory import MAX_CHUNK, ChunkBudget
from attnaudit.interventions.permutation import permutation_test
from attnaudit.interventions.reference_run import reference
from attnaudit.interventions.runner import item_chunks


@pytest.mark.parametrize(("text", "size"), [("2GiB", 2 << 30), ("512MB", 512 * 10**6),
                                            ("800M", 800 << 20), ("1.5kib", 1536), (4096, 4096)])
def test_parse_memory(text, size):
    assert parse_memory(text) == size


@pytest.mark.parametrize("text", ["", "lots", "-1GB", "0", "2 TB"])
def test_parse_memory_refuses_what_it_cannot_read(text):
    with pytest.raises(ValueError, match="memory"):
        parse_memory(text)


def test_budget_reads_the_model_and_scales_with_vocabulary_and_positions():
    transformers = pytest.importorskip("transformers")

    config = transformers.BartConfig(vocab_size=50, d_model=16, encoder_layers=1,
                                     decoder_layers=3, encoder_attention_heads=2,
                                     decoder_attention_heads=2, encoder_ffn_dim=32,
                                     decoder_ffn_dim=32)
    model = transformers.BartForConditionalGeneration(config)
    budget = ChunkBudget.of(model, vocab=58_101, keys=40, site_heads=8, state_bytes=0,
                            max_memory="1GiB")
    assert (budget.width, budget.layers) == (16, 3)
    assert budget.element_size == 4
    # a sequence costs at least its float32 logits and softmax at every position run
    assert budget.sequence_bytes(16) >= 16 * 58_101 * 8
    assert budget.sequences(16) < budget.sequences(1) <= MAX_CHUNK
    assert budget.sequences(1) * budget.sequence_bytes(1) <= 1 << 30
    assert budget.sequences(1, grad=True) < budget.sequences(1)
    tiny = ChunkBudget.of(model, vocab=58_101, keys=40, site_heads=8, state_bytes=0,
                          max_memory=1)
    assert tiny.sequences(16) == 1  # never zero


@pytest.mark.parametrize("incremental", [True, False])
def test_chunks_follow_the_budget_and_results_do_not_depend_on_it(incremental):
    from attnaudit_examples.date.target import make_target

    target = make_target(limit=3)
    batch = next(target.iter_batches(3))
    roomy = reference(target, batch, incremental=incremental)
    tight = reference(target, batch, incremental=incremental, max_memory="200KiB")
    rows = tight.rows()
    step = rows.step.repeat_interleave(3)
    chunks = list(item_chunks(tight, step))
    assert sorted(torch.cat(chunks).tolist()) == list(range(len(step)))
    assert len(chunks) > len(list(item_chunks(roomy, step)))
    for chunk in chunks:
        last = int(step[chunk].max())
        assert len(chunk) <= tight.budget.sequences(tight.positions(last))
        if incremental:  # one cached step per chunk: a single step
            assert len(torch.unique(step[chunk])) == 1
    a = permutation_test(target, roomy, n_permutations=3)
    b = permutation_test(target, tight, n_permutations=3)
    for column in ("perm_median_tvd", "perm_median_jsd", "perm_flip_rate"):
        assert (a[column] - b[column]).abs().max() <= 1e-5, column  # BLAS rounding
