"""Rows no weight intervention can say anything about, counted apart instead of averaged.

A row is one (example, step) up to and including the first end-of-sequence step. It is
*degenerate*, and left out of every per-row protocol (permutation, uniform, zeroing,
values, cumulative removal, adversarial search), when:

- ``empty output``: the model's greedy output is empty — end-of-sequence at step 0 — so
  there is no emitted token whose attention could explain it;
- ``no eligible key``: every source key is padding or a special token (a source the
  tokenizer turned into special tokens only), so there is no weight to move;
- ``one eligible key``: the only eligible key holds all the movable weight; every
  permutation and the uniform weighting leave it unchanged (TVD exactly 0, which would
  count as "attention does not matter") and removing it leaves nothing to renormalise;
- ``negligible view mass``: at every edited site and head the row is a prompt view whose
  keys held less than :data:`NEGLIGIBLE_SHARE` of the raw row (a decoder-only model that
  put, say, 1e-39 of a row on the prompt): an edit of the view moves no more than that of
  the row, below float32's resolution, so it cannot change the output either.

The suite lists these rows in its ``degenerate`` table (example, step, n_valid, reason) and
their count per reason in its metadata; summaries never see them. Agreement keeps its own,
finer exclusions (see :mod:`attnaudit.attribution.agreement`). The validity audit counts
them with :class:`DegenerateCounter` (eligible keys: ``target.explain_keys``), and the CI
gate fails when every row is degenerate (:func:`attnaudit.validity.findings.input_findings`):
a gate that passes on no real input is worse than none.
"""

from __future__ import annotations

import pandas as pd
import torch

EMPTY_OUTPUT = "empty output"
NO_ELIGIBLE_KEY = "no eligible key"
ONE_ELIGIBLE_KEY = "one eligible key"
NEGLIGIBLE_VIEW = "negligible view mass"
REASONS = ("", EMPTY_OUTPUT, NO_ELIGIBLE_KEY, ONE_ELIGIBLE_KEY, NEGLIGIBLE_VIEW)  # 0: counted
# A view holding less of its raw row than float32's relative resolution: editing it moves
# less weight than the row's own rounding.
NEGLIGIBLE_SHARE = float(torch.finfo(torch.float32).eps)
COLUMNS = ["example", "step", "n_valid", "reason"]


def row_reasons(steps: torch.Tensor, eligible: torch.Tensor,
                empty_output: torch.Tensor, negligible: torch.Tensor | None = None
                ) -> torch.Tensor:
    """Long (B, T): for each row within ``steps`` (bool (B, T)) the index into
    :data:`REASONS` of why it is degenerate, 0 when it is counted (and for rows outside
    ``steps``). eligible: bool (B, T, n). empty_output: bool (B,), end-of-sequence at
    step 0. negligible: bool (B, T), the edited views hold a negligible share of the row
    (:func:`negligible_rows`), or None. The first reason that applies wins, in the order
    of :data:`REASONS`."""
    n_valid = eligible.sum(-1)
    reason = torch.zeros(steps.shape, dtype=torch.long)
    tiny = torch.zeros_like(steps) if negligible is None else negligible.cpu()
    for code, hit in reversed(list(enumerate([
            empty_output[:, None].expand_as(steps), n_valid == 0, n_valid == 1, tiny],
            start=1))):
        reason[hit.cpu()] = code
    return reason.masked_fill(~steps.cpu(), 0)


def negligible_rows(shares: list[torch.Tensor]) -> torch.Tensor | None:
    """Bool (B, T): rows where every edited site and head is a view holding less than
    :data:`NEGLIGIBLE_SHARE` of its raw row. shares: per edited site, its record's ``share``
    (B, H, T, 1); None when a site is no view (nothing is negligible then)."""
    if not shares:
        return None
    return torch.stack([(s[..., 0] < NEGLIGIBLE_SHARE).all(1) for s in shares]).all(0).cpu()


def degenerate_table(reason: torch.Tensor, eligible: torch.Tensor,
                     first_example: int) -> pd.DataFrame:
    """One row per degenerate (example, step) of a batch, with :data:`COLUMNS`; examples
    numbered from ``first_example``."""
    example, step = reason.nonzero(as_tuple=True)
    return pd.DataFrame({
        "example": (example + first_example).numpy(),
        "step": step.numpy(),
        "n_valid": eligible.sum(-1)[example, step].numpy(),
        "reason": pd.Series([REASONS[int(r)] for r in reason[example, step]], dtype=str),
    }, columns=COLUMNS)


def reason_counts(table: pd.DataFrame) -> dict[str, int]:
    """Degenerate rows per reason, every reason present (0 when none)."""
    counts = table["reason"].value_counts()
    return {reason: int(counts.get(reason, 0)) for reason in REASONS[1:]}


class DegenerateCounter:
    """Rows per reason over a run's batches (``rows``: every row up to end of sequence)."""

    def __init__(self, rows: int = 0, counts: dict[str, int] | None = None) -> None:
        self.rows = rows
        self.counts = dict.fromkeys(REASONS[1:], 0) | (counts or {})

    def update(self, steps: torch.Tensor, eligible: torch.Tensor, emitted: torch.Tensor,
               eos_id: int) -> None:
        """steps: bool (B, T), up to end of sequence; eligible: bool (B, n) or (B, T, n);
        emitted: the greedy ids (B, T). An output with no step at all (T = 0) counts as
        one empty-output row per example."""
        if emitted.shape[1] == 0:
            self.rows += emitted.shape[0]
            self.counts[EMPTY_OUTPUT] += emitted.shape[0]
            return
        empty_output = emitted[:, 0] == eos_id
        if eligible.ndim == 2:
            eligible = eligible[:, None, :].expand(-1, steps.shape[1], -1)
        reason = row_reasons(steps.cpu(), eligible.cpu(), empty_output.cpu())
        self.rows += int(steps.sum())
        for code, name in enumerate(REASONS[1:], start=1):
            self.counts[name] += int((reason == code).sum())

    @property
    def counted(self) -> int:
        """Rows that are not degenerate."""
        return self.rows - sum(self.counts.values())


def describe_counts(counts: dict[str, int]) -> str:
    """``"3 empty output, 1 one eligible key"``: the non-zero counts per reason, or "none"."""
    return ", ".join(f"{n} {reason}" for reason, n in counts.items() if n) or "none"
