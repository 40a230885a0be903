"""Peak memory of the permutation test (PATH cached or rerun) or of the gradient methods'
passes (PATH gradients) on a random BART of a given size and chunk budget, measured in its
own process: ``python -m tests.helpers.memory_probe WIDTH LAYERS BUDGET PATH FOLDER`` prints
``{"peak_mib": ..., "chunks": ...}``."""

from __future__ import annotations

import ctypes
import gc
import json
import sys
from pathlib import Path

import torch
import transformers

from attnaudit.attribution.methods import attribute
from attnaudit.interventions import runner
from attnaudit.interventions.memory import whole_passes
from attnaudit.interventions.permutation import permutation_test
from attnaudit.interventions.reference_run import reference
from attnaudit.targets import from_hf
from tests.helpers.tiny_hf import save_checkpoint

EXAMPLES, STEPS, SOURCE_WORDS, PERMUTATIONS = 8, 16, 30, 20


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(field)


def reset_peak() -> int:
    """Start measuring from here: freed heap memory handed back to the system (else later
    allocations reuse it unseen), then Linux's peak-RSS mark reset to the current RSS (kiB),
    so that nothing this process did before (loading libraries, building the model) counts."""
    gc.collect()
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)  # glibc; other C libraries differ
    if trim is not None:
        trim(0)
    Path("/proc/self/clear_refs").write_text("5")
    return _status_kib("VmRSS")


def peak_kib() -> int:
    return _status_kib("VmHWM")


def main(width: int, layers: int, budget: str, path: str, folder: Path) -> None:
    torch.set_num_threads(1)
    config = transformers.BartConfig(
        vocab_size=80, d_model=width, encoder_layers=1, decoder_layers=layers,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=4 * width,
        decoder_ffn_dim=4 * width, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None)
    words = save_checkpoint(transformers.BartForConditionalGeneration, config, folder)
    sources = [" ".join(words[(i * 7 + j) % 60] for j in range(SOURCE_WORDS))
               for i in range(EXAMPLES)]
    outputs = torch.randint(3, 80, (EXAMPLES, STEPS), generator=torch.Generator().manual_seed(0))
    target = from_hf(folder, sources).with_options(greedy=lambda batch: outputs[: len(batch)])
    batch = next(target.iter_batches(EXAMPLES))
    if path == "gradients":
        _gradients(target, batch, outputs, budget)
        return
    incremental = path == "cached"
    # libraries and allocator warmed up on one example, in chunks below any measured peak
    first = batch.select(torch.tensor([0]))
    permutation_test(target, reference(target, first, incremental=incremental,
                                              max_memory="1MiB"), n_permutations=1)
    before = reset_peak()
    ref = reference(target, batch, incremental=incremental, max_memory=budget)
    chunks = []
    original = runner.item_chunks

    def counted(*args, **kwargs):
        for chunk in original(*args, **kwargs):
            chunks.append(len(chunk))
            yield chunk

    runner.item_chunks = counted
    rows = permutation_test(target, ref, n_permutations=PERMUTATIONS)
    assert len(rows) == EXAMPLES * STEPS
    print(json.dumps({"peak_mib": (peak_kib() - before) / 1024, "chunks": len(chunks)}))


def _gradients(target, batch, outputs, budget: str) -> None:
    """The saliency passes of ``batch`` within ``budget``, after a warm-up on one example."""
    attribute(target, batch.select(torch.tensor([0])), outputs[:1], ["saliency"],
              max_memory="1MiB")
    before = reset_peak()
    attribute(target, batch, outputs, ["saliency"], max_memory=budget)
    per_pass = whole_passes(target, vocab=target.model.config.vocab_size,
                            keys=batch.source_ids.shape[1], steps=STEPS, grad=True,
                            max_memory=budget)
    print(json.dumps({"peak_mib": (peak_kib() - before) / 1024,
                      "chunks": -(-EXAMPLES // per_pass)}))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], Path(sys.argv[5]))
