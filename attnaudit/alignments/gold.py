"""A gold alignment file for an audit (``attnaudit report --gold FILE``, ``audit(gold=)``),
checked against the target's data before anything runs.

The file is Pharaoh (:mod:`attnaudit.alignments.pharaoh`), one line per example of the data
in order, in token units as a target's ``gold_alignments`` are: source token ``i`` is the
i-th eligible source token (``explain_keys``), output token ``j`` the j-th emitted token.
A link to a source token the example does not have is refused with its line number.
"""

from __future__ import annotations

from pathlib import Path

from attnaudit.alignments.pharaoh import Alignment, read_alignments
from attnaudit.errors import AlignmentError
from attnaudit.targets.contract import Seq2SeqTarget


def checked_gold(path: str | Path, target: Seq2SeqTarget,
                 limit: int | None = None) -> tuple[Alignment, ...]:
    """The alignments of ``path``, one per example of ``target``'s data (its first
    ``limit``: the file may go on past them); AlignmentError naming the file and line when
    the lines and the examples do not pair up or a link names a missing source token."""
    gold = read_alignments(path)
    seen = 0
    for batch in target.iter_batches(limit):
        counts = target.explain_keys(batch).sum(-1).tolist()
        for text, n_source in zip(batch.texts, counts, strict=True):
            far = max((i for i, _ in gold[seen].possible), default=-1) if seen < len(gold) \
                else -1
            if far >= n_source:
                raise AlignmentError(f"{path}, line {seen + 1}: source token {far} but "
                                     f"example {seen + 1} ({text!r}) has {n_source} source "
                                     f"tokens (0 to {n_source - 1}); is this the gold file "
                                     "of this data, in token units?")
            seen += 1
    if len(gold) < seen or (limit is None and len(gold) != seen):
        audited = (f"the data has {seen} examples" if limit is None
                   else f"the audit reads {seen} examples (limit {limit})")
        raise AlignmentError(f"{path} has {len(gold)} lines but {audited}; give one gold "
                             "line per example of the data")
    return tuple(gold[:seen])
