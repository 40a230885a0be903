"""Audit data as :func:`~attnaudit.targets.hf.loading.from_hf` takes it — a TSV path, an
iterable of strings (a list, a pandas Series, a ``datasets`` column) or a DataFrame — read
into sources, optional references and optional contrast outputs, and cut into batches.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnaudit.errors import TargetError
from attnaudit.targets.contract import Batch
from attnaudit.targets.datafile import DataRows, read_rows

# texts (B) -> source ids (B, n) long, source mask (B, n) bool, the batch's other inputs
SourceTokenizer = Callable[[list[str]], tuple[torch.Tensor, torch.Tensor, dict[str, Any]]]
# texts (B) -> output ids (B, T') long, padded with the end-of-sequence id
OutputTokenizer = Callable[[Sequence[str]], torch.Tensor]


@dataclass(frozen=True)
class AuditData:
    """The audit's sources, their references and their contrast outputs (None when not
    given; else one per source)."""

    sources: list[str]
    references: list[str] | None
    contrast: Sequence[str] | None

    def batches(self, size: int, device: torch.device, sources: SourceTokenizer,
                outputs: OutputTokenizer) -> Iterator[Batch]:
        """Batches of ``size`` sources in order, tokenized by ``sources``, with the
        contrast outputs tokenized by ``outputs`` as ``inputs["contrast_ids"]``; ids, mask
        and contrast ids on ``device`` (other inputs as ``sources`` gives them)."""
        for at in range(0, len(self.sources), size):
            texts = self.sources[at : at + size]
            ids, mask, inputs = sources(texts)
            if self.contrast is not None:
                inputs["contrast_ids"] = outputs(self.contrast[at : at + size]).to(device)
            yield Batch(ids.to(device), mask.to(device), texts,
                        None if self.references is None else self.references[at : at + size],
                        inputs)


def audit_data(data: Any, contrast: Sequence[str] | None) -> AuditData:
    """Sources, optional references and contrast outputs from a TSV path (its third column,
    or ``contrast``, not both), an iterable of strings (a list, a pandas Series, a
    ``datasets`` column), or a DataFrame laid out as the TSV's columns (sources, then
    optionally references, then optionally contrast outputs)."""
    pandas = sys.modules.get("pandas")
    if pandas is not None and isinstance(data, pandas.DataFrame):
        if data.shape[1] not in (1, 2, 3):
            raise TargetError(f"a DataFrame of audit data has 1 to 3 columns (sources, "
                              f"references, contrast outputs), got {data.shape[1]}: pass "
                              "those columns, e.g. frame[['source', 'target']]")
        references = list(data.iloc[:, 1]) if data.shape[1] > 1 else None
        sources = _read_rows(list(data.iloc[:, 0])).sources
        given = list(data.iloc[:, 2]) if data.shape[1] == 3 else None
        what = f"column {data.columns[-1]!r} of the DataFrame"
    else:
        rows = _read_rows(data)
        sources, references, given, what = rows.sources, rows.targets, rows.contrasts, data
    if given is not None:
        if contrast is not None:
            raise TargetError(f"{what} gives a contrast column and contrast outputs were "
                              "given as well (contrast=... or --contrast FILE); give one of "
                              "them")
        contrast = given
    else:
        what = "contrast="
    wrong = [c for c in contrast or () if not isinstance(c, str)]
    if wrong:
        raise TargetError(f"contrast outputs must be strings, got "
                          f"{type(wrong[0]).__name__} {wrong[0]!r} in {what}")
    wrong = [s for s in sources if not isinstance(s, str)]
    if wrong:
        raise TargetError(f"audit sources must be strings, got {type(wrong[0]).__name__} "
                          f"{wrong[0]!r}")
    return AuditData(sources, references, contrast)


def _read_rows(data: str | Path | Sequence[str]) -> DataRows:
    if isinstance(data, str | Path):
        rows = read_rows(data)
        if (note := rows.skipped_note(data)) is not None:
            warnings.warn(f"attnaudit: {note}", stacklevel=2)
        return rows
    sources = list(data)
    if not sources:
        raise TargetError("the audit data is empty")
    return DataRows(sources, None, None)
