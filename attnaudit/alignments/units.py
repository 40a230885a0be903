"""What an alignment links: source and target *units* (words or tokens), and which query row
of a (T, S) map stands for each target token (the step convention).

Units:

- ``words``: source words by the report's word rules (:func:`attnaudit.analysis.words.
  source_words`: the tokenizer's offsets, else the tokens located in the text, else their
  markers); target words by the marker rule of :mod:`attnaudit.analysis.aggregation` (the
  output has no text offsets), so a tokenizer without word markers (the date models'
  characters, a word-level vocabulary) makes every output token a word;
- ``tokens``: every eligible source token (``target.explain_keys``: no padding, no special
  token) is a unit, numbered in order; every output token is a unit.

The output tokens are the emitted tokens before the first end-of-sequence token (the
end-of-sequence token itself is not aligned). Step conventions for output token ``j``:

- ``emit``: the row of step ``j``, the step that emits the token;
- ``input``: the row of step ``j + 1``, where the token is the decoder's input (the
  convention of Garg et al. 2019 and Kobayashi et al. 2020 for attention alignments); the
  last output token has that row only when the end-of-sequence step follows it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnaudit.analysis.aggregation import words_from_tokens
from attnaudit.analysis.words import source_words
from attnaudit.errors import AlignmentError
from attnaudit.targets.contract import Batch, Seq2SeqTarget

UNITS = ("words", "tokens")
CONVENTIONS = ("emit", "input")
DEFAULT_CONVENTION = "emit"  # what the command line, align() and the docs default to


@dataclass(frozen=True)
class Units:
    """One batch's units. source: long (B, S), per source position its source unit or -1.
    rows: per example, per target unit the query rows (steps) whose map rows it sums, for
    the chosen convention (empty: no row). n_source: per example, its source units.
    rule: the word rule of the source side."""

    source: torch.Tensor
    rows: list[list[list[int]]]
    n_source: list[int]
    rule: str


def _check(units: str, convention: str) -> None:
    if units not in UNITS:
        raise AlignmentError(f"units must be one of {', '.join(UNITS)}, got {units!r}")
    if convention not in CONVENTIONS:
        raise AlignmentError(f"the step convention must be one of {', '.join(CONVENTIONS)}, "
                             f"got {convention!r}")


def output_lengths(target: Seq2SeqTarget, emitted: torch.Tensor) -> list[int]:
    """Per example, its output tokens: the emitted ones before the first end-of-sequence."""
    before_eos = target.step_mask(emitted) & (emitted != target.eos_id)
    return [int(n) for n in before_eos.sum(-1).tolist()]


def batch_units(target: Seq2SeqTarget, batch: Batch, emitted: torch.Tensor, units: str,
                convention: str) -> Units:
    """The source and target units of ``batch`` whose greedy output is ``emitted`` (B, T)."""
    _check(units, convention)
    keep = target.explain_keys(batch).cpu()
    if units == "words":
        words, rule = source_words(target, batch)
        source = torch.tensor(words, dtype=torch.long).reshape(keep.shape)
    else:
        source = torch.where(keep, keep.long().cumsum(-1) - 1, -1)
        rule = "tokens"
    lengths = output_lengths(target, emitted)
    steps = target.step_mask(emitted).cpu()
    labels = target.target_tokens(emitted) if units == "words" else None
    rows = []
    for b, length in enumerate(lengths):
        if labels is None:
            groups = list(range(length))
        else:
            groups = words_from_tokens([str(t) for t in labels[b][:length]])[0]
        shift = 1 if convention == "input" else 0
        per_unit: list[list[int]] = [[] for _ in range(max(groups, default=-1) + 1)]
        for token, unit in enumerate(groups):
            step = token + shift
            if unit >= 0 and step < steps.shape[1] and bool(steps[b, step]):
                per_unit[unit].append(step)
        rows.append(per_unit)
    n_source = [int(row.max()) + 1 if row.numel() else 0 for row in source]
    return Units(source, rows, n_source, rule)
