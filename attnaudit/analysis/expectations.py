"""Build expected key sets (for :class:`~attnaudit.analysis.regions.RegionAnalyser`) and read
gold word alignments (for :class:`~attnaudit.analysis.alignment.AlignmentAnalyser`).

Word spans (:func:`keys_from_word_spans`) are half-open ``(first, end)`` word indices, the
words of :mod:`attnaudit.analysis.aggregation`.

Character spans are half-open ``(start, end)`` offsets into the source text, the convention
of Python slices and of Hugging Face fast tokenizers' ``return_offsets_mapping``. A token
is expected when its own character range ``[t_start, t_end)`` overlaps a span:
``max(t_start, s_start) < min(t_end, s_end)``. Empty ranges overlap nothing, so special
tokens (offsets ``(0, 0)``) and empty spans never match.

Pharaoh alignments: one line per sentence pair, whitespace-separated links ``i-j`` (sure)
or ``i?j`` (possible), where ``i`` is the 0-based index of a *source* word and ``j`` of a
*target* word. Links are returned as ``(i, j)`` = (source word, target word).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import torch

from attnaudit.errors import AnalysisError

Span = tuple[int, int]
Link = tuple[int, int]
Offsets = Sequence[Sequence[int]] | torch.Tensor


def char_offsets(text: str) -> list[Span]:
    """Offsets for a character-level tokenizer: token i is character i, ``(i, i + 1)``."""
    return [(i, i + 1) for i in range(len(text))]


def _spans(spans: Iterable[Span | range]) -> list[Span]:
    out = []
    for span in spans:
        if isinstance(span, range):
            if span.step != 1:
                raise AnalysisError(f"span {span!r}: a range span needs step 1")
            start, end = span.start, span.stop
        else:
            try:
                start, end = span
            except (TypeError, ValueError):
                raise AnalysisError(f"span {span!r} is not a (start, end) pair") from None
        if not 0 <= int(start) <= int(end):
            raise AnalysisError(f"span {span!r}: need 0 <= start <= end")
        out.append((int(start), int(end)))
    return out


def keys_from_char_spans(offsets: Offsets, spans: Iterable[Span | range],
                         n_keys: int) -> torch.Tensor:
    """Bool (n_keys,): True on tokens whose character range overlaps one of ``spans``.

    Args:
        offsets: per token ``(start, end)`` character offsets, length <= n_keys (a list,
            or a (tokens, 2) tensor); keys past the end (padding) are False.
        spans: ``(start, end)`` character spans (or step-1 ranges) in the same text.
        n_keys: length of the key axis.
    """
    pairs = offsets.tolist() if isinstance(offsets, torch.Tensor) else list(offsets)
    if len(pairs) > n_keys:
        raise AnalysisError(f"{len(pairs)} token offsets do not fit in n_keys={n_keys}")
    wanted = _spans(spans)
    out = torch.zeros(n_keys, dtype=torch.bool)
    for k, pair in enumerate(pairs):
        start, end = (int(x) for x in pair)
        out[k] = any(max(start, s) < min(end, e) for s, e in wanted)
    return out


def keys_from_word_spans(words: Sequence[int] | torch.Tensor,
                         spans: Iterable[Span | range], n_keys: int) -> torch.Tensor:
    """Bool (n_keys,): True on tokens whose word lies in one of ``spans``.

    Args:
        words: per token its word index, -1 for none (padding, special tokens), as
            :func:`~attnaudit.analysis.aggregation.words_from_offsets` or
            :func:`~attnaudit.analysis.example_maps.source_words` give it; length <= n_keys.
        spans: half-open ``(first word, end word)`` pairs (or step-1 ranges) of word indices.
        n_keys: length of the key axis.
    """
    index = torch.as_tensor(words, dtype=torch.long).reshape(-1)
    if index.numel() > n_keys:
        raise AnalysisError(f"{index.numel()} token words do not fit in n_keys={n_keys}")
    out = torch.zeros(n_keys, dtype=torch.bool)
    for start, end in _spans(spans):
        out[: index.numel()] |= (index >= start) & (index < end)
    return out


def expected_from_spans(offsets_batch: Sequence[Offsets],
                        spans_batch: Sequence[Iterable[Span | range]],
                        n_keys: int) -> torch.Tensor:
    """Bool (B, n_keys): :func:`keys_from_char_spans` per example."""
    if len(offsets_batch) != len(spans_batch):
        raise AnalysisError(f"{len(offsets_batch)} offset lists but {len(spans_batch)} span lists")
    out = torch.zeros(len(offsets_batch), n_keys, dtype=torch.bool)
    for row, (offsets, spans) in enumerate(zip(offsets_batch, spans_batch, strict=True)):
        out[row] = keys_from_char_spans(offsets, spans, n_keys)
    return out


def expected_from_callable(sources: Sequence[str],
                           fn: Callable[[str], Iterable[Span | range]],
                           offsets_batch: Sequence[Offsets], n_keys: int) -> torch.Tensor:
    """Bool (B, n_keys): spans found by ``fn(source_text)`` mapped onto each example's tokens.

    ``offsets_batch[b]`` must be the offsets of ``sources[b]`` as tokenized for the keys.
    """
    if len(sources) != len(offsets_batch):
        raise AnalysisError(f"{len(sources)} sources but {len(offsets_batch)} offset lists")
    return expected_from_spans(offsets_batch, [fn(s) for s in sources], n_keys)


_LINK = re.compile(r"^(\d+)([-?])(\d+)$")


def read_pharaoh(path_or_lines: str | os.PathLike[str] | Iterable[str]
                 ) -> list[tuple[set[Link], set[Link]]]:
    """Gold links per sentence pair: ``(sure, possible)`` sets of (source i, target j).

    ``path_or_lines`` is a file path (a ``str`` is always read as a path) or an iterable of
    lines. ``i-j`` is a sure link, ``i?j`` a possible one; ``possible`` includes every sure
    link (S within P). Indices are kept as written (0-based Pharaoh); an empty line is a
    pair with no links. A malformed token raises ValueError naming the line.
    """
    if isinstance(path_or_lines, (str, os.PathLike)):
        lines: Iterable[str] = Path(path_or_lines).read_text(encoding="utf-8").splitlines()
    else:
        lines = path_or_lines
    out = []
    for number, line in enumerate(lines, start=1):
        sure: set[Link] = set()
        possible: set[Link] = set()
        for token in line.split():
            match = _LINK.match(token)
            if match is None:
                raise AnalysisError(f"line {number}: {token!r} is not a Pharaoh link "
                                    "('i-j' sure or 'i?j' possible)")
            link = (int(match.group(1)), int(match.group(3)))
            (sure if match.group(2) == "-" else possible).add(link)
        out.append((sure, possible | sure))
    return out
