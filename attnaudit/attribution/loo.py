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

Windowed variant (``window`` > 1, the quick audit's on long prompts): an example's eligible
keys, in key order, are cut into consecutive groups of ``window`` eligible keys (the last
may be shorter); each group is replaced at once (one edited sequence) and every key of the
group gets that edit's TVD. ``window=1`` is leave-one-out itself. :func:`quick_window` sizes
the window per example so that it runs at most :data:`QUICK_LOO_EDITS` edits, or on a model
whose edited sequences cost more, :func:`quick_edits` of them. A full audit replaces every key
alone unless an example's keys cost more edited sequences than the work budget buys
(:mod:`attnaudit.interventions.work_budget`): then it runs :func:`audit_edits` of them, in
windows sized the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import torch

from attnaudit.attribution.inputs import resolve_pad_id
from attnaudit.errors import InterventionError
from attnaudit.interventions.edited_sources import EditedSourcePasses
from attnaudit.interventions.memory import whole_passes
from attnaudit.interventions.outputs import tvd
from attnaudit.interventions.runner import progress_bar
from attnaudit.targets.contract import Batch, Seq2SeqTarget

# eligible keys replaced per edit: one for every example, or a function of the example's
# number of eligible keys
Window = int | Callable[[int], int]
QUICK_LOO_EDITS = 20  # the most edits the quick audit's leave-one-out runs per example
# ... fewer where that many edited sequences cost more than these multiply-adds (parameters x
# tokens per sequence): as many as they buy, and at least QUICK_LOO_MIN_EDITS
QUICK_LOO_MULTIPLY_ADDS = 1e12
QUICK_LOO_MIN_EDITS = 8


def quick_edits(sequence_multiply_adds: float) -> int:
    """The most edits per example of the quick audit's leave-one-out on a model whose
    edited sequence costs ``sequence_multiply_adds`` (parameters x tokens per sequence):
    :data:`QUICK_LOO_EDITS`, or as many as :data:`QUICK_LOO_MULTIPLY_ADDS` buy when fewer,
    at least :data:`QUICK_LOO_MIN_EDITS` (the date models: 20; a 1.24B-parameter model on
    102-token sequences: 8)."""
    fits = int(QUICK_LOO_MULTIPLY_ADDS // max(sequence_multiply_adds, 1.0))
    return max(QUICK_LOO_MIN_EDITS, min(QUICK_LOO_EDITS, fits))


def quick_window(n_eligible: int, edits: int = QUICK_LOO_EDITS) -> int:
    """The quick audit's window on an example with ``n_eligible`` keys and at most
    ``edits`` edits: ``ceil(n_eligible / edits)``, at least 1 (20 edits: every key alone up
    to 20 keys; 96 keys: windows of 5)."""
    return max(1, -(-n_eligible // edits))


def audit_edits(quick: bool, sequence_multiply_adds: float = 0.0,
                work_budget: float = math.inf) -> int | None:
    """The most edits per example of the intervention suite's leave-one-out
    (``sequence_multiply_adds``: what one edited sequence costs the model, parameters x
    tokens): :func:`quick_edits` in a quick audit; in a full one as many as ``work_budget``
    buys, at least :data:`QUICK_LOO_MIN_EDITS`, or None (every key alone) without a
    budget."""
    if quick:
        return quick_edits(sequence_multiply_adds)
    if math.isinf(work_budget):
        return None
    return max(QUICK_LOO_MIN_EDITS, int(work_budget // max(sequence_multiply_adds, 1.0)))


def audit_window(quick: bool, sequence_multiply_adds: float = 0.0,
                 work_budget: float = math.inf) -> Window:
    """The intervention suite's window: :func:`quick_window` per example, at most
    :func:`audit_edits` edits (every key alone, 1, where they are not bounded)."""
    edits = audit_edits(quick, sequence_multiply_adds, work_budget)
    if edits is None:
        return 1
    return quick_window if edits == QUICK_LOO_EDITS else partial(quick_window, edits=edits)


def example_windows(eligible: torch.Tensor, window: Window) -> torch.Tensor:
    """(B,) long: each example's window, from its eligible keys ``eligible`` (B, n) bool."""
    counts = eligible.sum(1).tolist()
    sizes = [window] * len(counts) if isinstance(window, int) else [window(n) for n in counts]
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise InterventionError(f"a leave-one-out window must be a positive number of "
                                    f"keys, got {size!r}")
    return torch.tensor(sizes, dtype=torch.long)


def edit_groups(eligible: torch.Tensor, window: Window
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The eligible (example, key) pairs of ``eligible`` (B, n) bool, each (K,) long in
    example then key order, and each pair's edit (K,) long: edits number every example's
    consecutive groups of its window's eligible keys, in example then group order."""
    eligible = eligible.cpu()
    example, key = eligible.nonzero(as_tuple=True)
    counts = eligible.sum(1)
    windows = example_windows(eligible, window)
    rank = torch.arange(len(key)) - (counts.cumsum(0) - counts)[example]  # within its example
    edits = -(-counts // windows)
    edit = (edits.cumsum(0) - edits)[example] + rank // windows[example]
    return example, key, edit


def edit_count(eligible: torch.Tensor, window: Window) -> int:
    """The edited sequences leave-one-out runs on eligible keys (B, n) bool with ``window``."""
    edit = edit_groups(eligible, window)[2]
    return int(edit.max()) + 1 if len(edit) else 0


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


class _Edits(NamedTuple):
    """:func:`edit_groups` of a batch's eligible keys (``example``, ``key``, ``edit``: (K,)
    long each), each edit's example and first (lowest) key (E,) long, and the run order of
    the edits (E,) long: by their first key, so that a chunk's prompts share a longer
    prefix."""

    example: torch.Tensor
    key: torch.Tensor
    edit: torch.Tensor
    edited_example: torch.Tensor
    lowest: torch.Tensor
    order: torch.Tensor


def _edits(target: Seq2SeqTarget, batch: Batch, window: Window) -> _Edits:
    example, key, edit = edit_groups(target.explain_keys(batch), window)
    first = torch.ones(len(edit), dtype=torch.bool)
    first[1:] = edit[1:] != edit[:-1]
    return _Edits(example, key, edit, example[first], key[first],
                  torch.argsort(key[first], stable=True))


def edit_sequences(target: Seq2SeqTarget, batch: Batch, states: Any, window: Window, *,
                   vocab: int, steps: int, max_memory: int | str | None) -> float:
    """What :func:`leave_one_out` on ``batch`` with ``window`` and the decoder ``states``
    costs in whole teacher-forced sequences of ``steps`` output steps (vocabulary ``vocab``;
    :meth:`~attnaudit.interventions.edited_sources.EditedSourcePasses.sequences`): fewer
    than its edits where the cache serves them."""
    edits = _edits(target, batch, window)
    passes = EditedSourcePasses(target, batch, states)
    chunk = passes.chunk_size(len(edits.order), whole_passes(
        target, vocab=vocab, keys=int(batch.source_ids.shape[1]), steps=steps,
        max_memory=max_memory))
    return passes.sequences(edits.lowest[edits.order], chunk, steps)


def leave_one_out(target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor,
                  replace_with: str | int = "pad", *, pad_id: int | None = None,
                  chunk_size: int | None = None, reference_probs: torch.Tensor | None = None,
                  max_memory: int | str | None = None, progress: bool = False,
                  states: Any = None, window: Window = 1) -> torch.Tensor:
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
        window: eligible keys replaced at once per edit (module docstring), or a function
            of an example's number of eligible keys giving its window (:func:`quick_window`);
            1: every key alone.

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
        example, key, edit, edited_example, _, by_key = _edits(target, batch, window)
        slot = torch.empty_like(by_key)  # each pair's edit in run order
        slot[by_key] = torch.arange(len(by_key))
        slot = slot[edit]
        passes = EditedSourcePasses(target, batch, states)
        n_keys, n_edits = batch.source_ids.shape[1], len(by_key)
        if chunk_size is None:
            chunk_size = whole_passes(target, vocab=int(reference_probs.shape[-1]),
                                      keys=n_keys, steps=n_steps, max_memory=max_memory)
        chunk_size = passes.chunk_size(n_edits, chunk_size)
        importance = torch.zeros(n_examples, n_steps, n_keys)
        with progress_bar(n_edits, "leave-one-out", progress) as bar:
            for at in range(0, n_edits, chunk_size):
                rows = edited_example[by_key[at : at + chunk_size]]
                part = (slot >= at) & (slot < at + len(rows))
                local, keys = slot[part] - at, key[part]
                ids = batch.source_ids[rows.to(batch.source_ids.device)].clone()
                ids[local, keys] = token
                logits = passes.logits(rows, ids, emitted[rows])
                probs = torch.softmax(logits.float(), -1).cpu()
                importance[example[part], :, keys] = tvd(probs, reference_probs[rows])[local]
                bar.update(len(rows))
    return importance * target.step_mask(emitted).cpu()[:, :, None]
