"""Input leave-one-out: replace one source token, measure how the output moves (docs/metrics.md).

Variant reported: *replacement*, not deletion. The token at source position ``j`` is
replaced by the pad token (or a chosen id) and the position stays: ``source_mask`` and every
other input (lengths, ...) are unchanged, so the sequence keeps its length and the other
tokens their positions. Whatever the model derives from the ids themselves follows the
replacement (the date LSTM computes its attention mask as ``ids != PAD``, so there a pad
replacement also masks the key; a Hugging Face model, masked by ``source_mask``, reads the
pad token as an ordinary token). The decoder is teacher-forced on the unmodified input's
greedy output, and the importance of key ``j`` at step ``t`` is
``tvd(p(. | y_<t, x), p(. | y_<t, x with x_j replaced))`` over the whole vocabulary.

Every eligible (example, key) replacement is one folded sequence; one forward pass serves a
chunk of them (as many as the memory budget allows, since every step's distribution is
compared) and gives every step at once.
"""

from __future__ import annotations

from typing import Any

import torch

from attnaudit.attribution.inputs import resolve_pad_id
from attnaudit.errors import InterventionError
from attnaudit.interventions.edited_sources import EditedSourcePasses
from attnaudit.interventions.memory import ChunkBudget, encoder_bytes
from attnaudit.interventions.outputs import tvd
from attnaudit.interventions.runner import progress_bar
from attnaudit.targets.contract import Batch, Seq2SeqTarget


def replacement_id(target: Seq2SeqTarget, batch: Batch, replace_with: str | int,
                   pad_id: int | None = None) -> int:
    """The token id that replaces each left-out token: the pad id for ``"pad"``, else the
    given id (checked against the source embedding's vocabulary when it has one)."""
    if isinstance(replace_with, str):
        if replace_with != "pad":
            raise InterventionError(f'replace_with must be "pad" or a token id, got '
                                    f'{replace_with!r}')
        return resolve_pad_id(target, batch, pad_id)
    if isinstance(replace_with, bool) or not isinstance(replace_with, int):
        raise TypeError(f'replace_with must be "pad" or an int token id, got '
                        f"{type(replace_with).__name__}")
    vocab = getattr(target.source_embedding, "num_embeddings", None)
    if replace_with < 0 or (vocab is not None and replace_with >= vocab):
        raise InterventionError(f"replacement token id {replace_with} is outside the source "
                                f"vocabulary (0..{vocab - 1 if vocab is not None else '?'})")
    return replace_with


def leave_one_out(target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor,
                  replace_with: str | int = "pad", *, pad_id: int | None = None,
                  chunk_size: int | None = None, reference_probs: torch.Tensor | None = None,
                  max_memory: int | str | None = None, progress: bool = False,
                  states: Any = None) -> torch.Tensor:
    """Leave-one-out importance (B, T, n) in TVD units, [0, 1].

    Args:
        target: the audit target (reads the source from ``batch.source_ids``).
        batch: B sources. emitted: (B, T) long, the model's greedy output.
        replace_with: ``"pad"`` or a token id put in place of each left-out token.
        pad_id: the pad token for ``"pad"``; by default found as :func:`resolve_pad_id` does.
        chunk_size: folded sequences per forward pass (default: from ``max_memory``).
        reference_probs: (B, T, V) teacher-forced probabilities of the unmodified batch,
            when the caller already has them.
        max_memory: the budget of one chunk (bytes or "2GiB"; default
            :data:`~attnaudit.capturing.blocks.DEFAULT_MAX_MEMORY`).
        progress: show a progress bar over the replaced sequences.
        states: the batch's unedited decoder states (``Reference.states``), from which a
            decoder-only target runs each replaced prompt from the left-out position on
            (:class:`~attnaudit.interventions.edited_sources.EditedSourcePasses`).

    Returns 0 for keys that are not eligible (``target.explain_keys``) and for steps after the
    first end-of-sequence (``target.step_mask``).
    """
    if emitted.ndim != 2 or emitted.shape[0] != len(batch) or emitted.dtype != torch.long:
        raise InterventionError(f"emitted must be long ids (B={len(batch)}, T), got "
                                f"{emitted.dtype} {tuple(emitted.shape)}")
    if chunk_size is not None and chunk_size < 1:
        raise InterventionError(f"chunk_size must be positive, got {chunk_size}")
    token = replacement_id(target, batch, replace_with, pad_id)
    with torch.no_grad():
        if reference_probs is None:
            reference_probs = torch.softmax(target.teacher_forced(batch, emitted).float(), -1)
        n_examples, n_steps = emitted.shape
        if reference_probs.shape[:2] != (n_examples, n_steps):
            raise InterventionError(f"reference_probs has shape {tuple(reference_probs.shape)}, "
                                    f"expected ({n_examples}, {n_steps}, V)")
        reference_probs = reference_probs.float().cpu()
        example, key = target.explain_keys(batch).cpu().nonzero(as_tuple=True)
        by_key = torch.argsort(key, stable=True)  # a chunk's prompts share a longer prefix
        example, key = example[by_key], key[by_key]
        passes = EditedSourcePasses(target, batch, states)
        n_keys = batch.source_ids.shape[1]
        if chunk_size is None:
            budget = ChunkBudget.of(target.model, vocab=int(reference_probs.shape[-1]),
                                    keys=n_keys, site_heads=0,
                                    state_bytes=encoder_bytes(target.model, n_keys),
                                    max_memory=max_memory)
            chunk_size = budget.sequences(n_steps, compared=n_steps)
        chunk_size = passes.chunk_size(len(example), chunk_size)
        importance = torch.zeros(n_examples, n_steps, n_keys)
        with progress_bar(len(example), "leave-one-out", progress) as bar:
            for at in range(0, len(example), chunk_size):
                rows, keys = example[at : at + chunk_size], key[at : at + chunk_size]
                ids = batch.source_ids[rows.to(batch.source_ids.device)].clone()
                ids[torch.arange(len(rows)), keys] = token
                logits = passes.logits(rows, ids, emitted[rows])
                probs = torch.softmax(logits.float(), -1).cpu()
                importance[rows, :, keys] = tvd(probs, reference_probs[rows])
                bar.update(len(rows))
    return importance * target.step_mask(emitted).cpu()[:, :, None]
