"""Teacher-forced passes over edited copies of a batch's sources (leave-one-out, the
faithfulness curves), from the unedited pass's cache where the family allows it.

A decoder-only target's prompt is read left to right, so an edited prompt whose first
changed position is ``s`` has the unedited keys and values before ``s``: with the reference
run's decoder states and the target's ``teacher_forced_from``, only positions ``s`` onward
run (on a long prompt with edits late in it, most of the pass). Edited copies are taken in
order of their first changed position, so a chunk's copies start near one another; a chunk
runs from the earliest, and the copies are split into at least :data:`CACHED_CHUNKS` chunks
(a chunk from position 0 saves nothing; on a model large enough for the cache to matter, a
smaller chunk costs little more per copy). The last copy of the first cached chunk of every
:class:`EditedSourcePasses` is also run whole, alone, and compared (total variation within
:func:`~attnaudit.analysis.cached_decoding.step_tolerance` of the logits' dtype, on every
step; the copy whose example the chunk's state selection places furthest from the first);
a gap, or a target without the states, runs every chunk whole. Encoder-decoder
targets always run whole (the encoder reads the whole source).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from attnaudit.analysis.cached_decoding import logits_tvd, step_tolerance
from attnaudit.targets.contract import Batch, DecoderOnlyTarget, Seq2SeqTarget, select_state


def first_changes(original: torch.Tensor, edited: torch.Tensor) -> torch.Tensor:
    """(E,) long: each edited row's first position differing from ``original`` (E, P)
    (P where none does)."""
    differs = edited != original
    return torch.where(differs.any(-1), differs.int().argmax(-1),
                       torch.full_like(differs[:, 0], edited.shape[1], dtype=torch.long))


CACHED_CHUNKS = 8  # the fewest chunks edited copies run in when the cache serves them


class EditedSourcePasses:
    """Logits of edited copies of ``batch`` (module docstring). states: the reference run's
    decoder states of ``batch`` (``Reference.states``), or None."""

    def __init__(self, target: Seq2SeqTarget, batch: Batch, states: Any) -> None:
        self.target, self.batch, self.states = target, batch, states
        self.cached = (isinstance(target, DecoderOnlyTarget) and states is not None
                       and target.teacher_forced_from is not None)
        self.checked = False

    def chunk_size(self, copies: int, budget: int) -> int:
        """Copies per pass: ``budget`` (the memory budget's), or fewer so that ``copies``
        run in at least :data:`CACHED_CHUNKS` passes when the cache serves them."""
        if not self.cached:
            return budget
        return max(1, min(budget, -(-copies // CACHED_CHUNKS)))

    def sequences(self, starts: torch.Tensor, chunk: int, steps: int) -> float:
        """What copies whose first changed positions are ``starts`` (E,) long, in run order,
        cost in whole teacher-forced sequences of ``P + steps`` positions, run ``chunk`` per
        pass: a cached chunk's copies from its earliest start on (a share of a sequence
        each; a chunk from position 0 costs whole ones) and the copy the first cached chunk
        also runs whole; every copy whole without the cache. An estimate for the plan: it
        counts positions, not the cache's selection or the vocabulary's projection."""
        total = int(self.batch.source_ids.shape[1]) + steps
        whole, checked = 0.0, False
        for at in range(0, len(starts), chunk):
            part = starts[at : at + chunk]
            start = self._run_from(int(part.min()))
            whole += len(part) * (total - start) / total
            checked = checked or start > 0
        return whole + float(checked)

    def _run_from(self, first: int) -> int:
        """The position a chunk whose earliest first change is ``first`` runs from: 0 (a
        whole pass) without the cache, else ``first``, at most the prompt's last position
        (it feeds step 0)."""
        return min(first, int(self.batch.source_ids.shape[1]) - 1) if self.cached else 0

    def logits(self, rows: torch.Tensor, ids: torch.Tensor, emitted: torch.Tensor
               ) -> torch.Tensor:
        """(R, T, V): teacher-forced logits of examples ``rows`` (R,) of the batch with their
        source ids replaced by ``ids`` (R, P), on ``emitted`` (R, T)."""
        edited = replace(self.batch.select(rows), source_ids=ids)
        start = self._run_from(int(first_changes(self.batch.source_ids[rows.to(ids.device)],
                                                 ids).min()))
        if start <= 0:
            return self.target.teacher_forced(edited, emitted)
        assert isinstance(self.target, DecoderOnlyTarget)
        assert self.target.teacher_forced_from is not None
        out = self.target.teacher_forced_from(edited, select_state(self.states, rows),
                                              emitted, start)
        if not self.checked:
            self.checked = True
            last = torch.tensor([len(rows) - 1])  # the chunk's last copy, alone
            whole = self.target.teacher_forced(edited.select(last), emitted[last])
            if not float(logits_tvd(out[last.to(out.device)], whole).max()) \
                    <= step_tolerance(whole.dtype):
                self.cached = False
                return self.target.teacher_forced(edited, emitted)
        return out
