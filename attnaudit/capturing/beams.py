"""Beam search records a person can read: :func:`beam_records`.

A capture around ``model.generate(..., num_beams=k)`` stores, for every decoder step, one
call per attention site with a row per *beam slot* (``batch * k`` rows): the slots are
reshuffled at every step as hypotheses overtake each other, so row ``r`` of step ``t`` and
row ``r`` of step ``t + 1`` usually belong to different hypotheses, and none of them need
be the one returned. :func:`beam_records` follows the returned hypotheses back through the
slots (Hugging Face's ``beam_indices``) and gives records whose row ``i`` is returned
sequence ``i`` and whose query ``t`` is the query that chose its token ``t``: the attention
behind the output, as a teacher-forced pass over that output would capture it.

Which calls are which: a site whose calls have one row per beam slot (``slots``) is a
decoder step site, its call ``t`` is step ``t``, and the step's query is the call's last
query row (a decoder-only model's first call runs the whole prompt; a cached step has
one query). A site whose calls have one row per example (an encoder run once, before the
inputs are expanded over beams) keeps every query, its rows gathered per returned sequence.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from attnaudit.errors import CaptureError
from attnaudit.record import AttentionCall, AttentionRecord


def beam_records(capture_or_records: Any, beams: Any, *, slots: int | None = None
                 ) -> dict[str, AttentionRecord]:
    """Records aligned to the sequences a beam search returned.

    Args:
        capture_or_records: a finished :class:`~attnaudit.capturing.recorder.Capture` of one
            ``generate`` call (or its ``records``: site name -> record).
        beams: the ``generate`` output with ``beam_indices`` (``return_dict_in_generate=True,
            output_scores=True``); or, from a custom loop, a long tensor ``(N, T)`` of
            back-pointers: entry ``[i, t]`` is the row (beam slot, flat over ``batch * k``)
            of step ``t``'s call whose query chose token ``t`` of returned sequence ``i``,
            ``-1`` once sequence ``i`` has ended (see :func:`beam_path` for loops that keep
            parent pointers).
        slots: the rows of one step's call, ``batch * k`` (default: the rows of the
            output's first ``scores`` entry; for a tensor, the most rows any site's
            calls have).

    Returns:
        Site name -> :class:`~attnaudit.record.AttentionRecord`, in capture order. A step
        site's record has one call per step ``t < T`` with weights ``(N, H, 1, K_t)``:
        stacked, ``(N, H, T, K)``, query ``t`` = the step that chose token ``t``; once a
        sequence has ended its rows are zero with no eligible key. A per-example site's
        record keeps its calls, row ``i`` = the example sequence ``i`` was decoded from.

    Raises CaptureError when the back-pointers and the captured calls do not fit together
    (a pointer past the slots, fewer step calls than steps, a site with another row count).
    """
    records = getattr(capture_or_records, "records", capture_or_records)
    if not isinstance(records, Mapping):
        raise TypeError("beam_records needs a Capture or its records (site -> record), got "
                        f"{type(capture_or_records).__name__}")
    path, slots = _path_and_slots(beams, slots, records)
    n = path.shape[0]
    aligned: dict[str, AttentionRecord] = {}
    for name, record in records.items():
        rows = {int(c.weights.shape[0]) for c in record.calls}
        if rows == {slots}:
            aligned[name] = _step_record(record, path)
        elif len(rows) == 1 and n % next(iter(rows)) == 0:
            per = n // next(iter(rows))
            aligned[name] = _example_record(record, torch.arange(n) // per)
        else:
            raise CaptureError(
                f"site {name!r}: calls with {sorted(rows)} rows fit neither the {slots} beam "
                f"slots nor the examples of the {n} returned sequences; capture one "
                "generate() call, and give slots= (batch * num_beams) when it differs")
    return aligned


def beam_path(parents: torch.Tensor, final: torch.Tensor) -> torch.Tensor:
    """Back-pointers for :func:`beam_records` from a custom loop's parent pointers.

    Args:
        parents: ``(T, S)`` long: ``parents[t, s]`` is the slot of step ``t``'s call whose
            query chose the token that slot ``s`` holds after step ``t`` (the hypothesis
            in slot ``s`` extends the one that slot ``parents[t, s]`` held before the step).
        final: ``(N,)`` long: the slot each returned sequence occupies after the last step.

    Returns:
        ``(N, T)`` long: entry ``[i, t]`` is the slot of step ``t`` that chose token ``t`` of
        sequence ``i`` (following the parents from the last step back to the first).
    """
    steps = parents.shape[0]
    path = torch.empty(final.shape[0], steps, dtype=torch.long, device=parents.device)
    holder = final.long()
    for t in range(steps - 1, -1, -1):
        path[:, t] = parents[t, holder]
        holder = path[:, t]
    return path


def _path_and_slots(beams: Any, slots: int | None, records: Mapping[str, AttentionRecord]
                    ) -> tuple[torch.Tensor, int]:
    """The ``(N, T)`` long back-pointers and the beam slot count, checked."""
    if isinstance(beams, torch.Tensor):
        path = beams
    else:
        found = getattr(beams, "beam_indices", None)
        if found is None:
            raise CaptureError(
                "the generate() output has no beam_indices: call generate(..., num_beams=k, "
                "return_dict_in_generate=True, output_scores=True), or pass the back-pointers "
                "as a (sequences, steps) tensor")
        path = found
        scores = getattr(beams, "scores", None)
        if slots is None and scores:
            slots = int(scores[0].shape[0])
    if path.ndim != 2 or path.dtype.is_floating_point or path.dtype == torch.bool:
        raise CaptureError(f"back-pointers must be an integer (sequences, steps) tensor, got "
                           f"{path.dtype} {tuple(path.shape)}")
    if slots is None:
        slots = max((int(c.weights.shape[0]) for r in records.values() for c in r.calls),
                    default=0)
    path = path.long().cpu()
    if bool((path >= slots).any()) or bool((path < -1).any()):
        raise CaptureError(f"back-pointers must lie in -1..{slots - 1} (one row per beam "
                           f"slot, -1 after a sequence ended), got {path.min()}..{path.max()}")
    return path, slots


def _step_record(record: AttentionRecord, path: torch.Tensor) -> AttentionRecord:
    """One call per step: the step's last query at each sequence's slot (zero once ended)."""
    steps = path.shape[1]
    if len(record.calls) < steps:
        raise CaptureError(f"site {record.name!r}: {len(record.calls)} calls for {steps} beam "
                           "steps; capture the whole generate() call")
    aligned = AttentionRecord(record.site)
    for t, call in enumerate(record.calls[:steps]):
        pointer = path[:, t].to(call.weights.device)
        alive = pointer >= 0
        rows = pointer.clamp_min(0)
        live = alive[:, None, None, None]
        weights = call.weights[rows, :, -1:].masked_fill(~live, 0)
        mask = _row_mask(call, rows) & live
        scores = None if call.scores is None else \
            call.scores[rows, :, -1:].masked_fill(~live, float("-inf"))
        aligned.append(AttentionCall(weights=weights, mask_source=_fixed(mask), scores=scores))
    return aligned


def _row_mask(call: AttentionCall, rows: torch.Tensor) -> torch.Tensor:
    """Bool ``(N, Hm, 1, K)``: the call's key mask at its last query, for slots ``rows``."""
    weights = call.weights
    mask = call.key_mask
    if mask is None:
        return torch.ones(rows.shape[0], 1, 1, weights.shape[-1], dtype=torch.bool,
                          device=weights.device)
    mask = mask[:, :, -1:].expand(weights.shape[0], mask.shape[1], 1, weights.shape[-1])
    return mask[rows]


def _example_record(record: AttentionRecord, example: torch.Tensor) -> AttentionRecord:
    """Every call kept, row ``i`` taken from example ``example[i]``."""
    aligned = AttentionRecord(record.site)
    for call in record.calls:
        rows = example.to(call.weights.device)
        mask = call.key_mask
        if mask is not None:
            mask = mask.expand(call.weights.shape[0], *mask.shape[1:])[rows]
        aligned.append(AttentionCall(
            weights=call.weights[rows], mask_source=_fixed(mask),
            scores=None if call.scores is None else call.scores[rows]))
    return aligned


def _fixed(mask: torch.Tensor | None) -> Any:
    return None if mask is None else (lambda: mask)
