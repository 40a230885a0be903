"""Word- and span-level rollups of token-level attention and attributions.

A *group map* assigns each key (token position) a group index — a word, a user span — or
-1 for keys that belong to none (padding, special tokens, text outside every span).
:func:`aggregate` folds a ``(..., keys)`` tensor into ``(..., groups)``:

- ``sum`` (the default, for mass): a word's attention is the sum of its tokens' weights, so
  a row's word-level weights sum to its mass on grouped keys (1 over real words when only
  padding and special tokens are left out); an attribution's word score is the sum of its
  tokens' scores (signed);
- ``max`` / ``mean``: the largest / average token value in the group, on request.

A group with no key is 0 under ``sum`` and NaN under ``max`` / ``mean``.

Word rules (:func:`words_from_offsets`, :func:`words_from_tokens`):

- *offsets* (a fast tokenizer's ``(start, end)`` character offsets): words are the maximal
  runs of non-whitespace characters of the text; a token belongs to the word holding its
  first non-whitespace character; a token with no such character (an empty range, as
  special tokens have) belongs to no word;
- *located tokens* (token strings and the text, no offsets): each kept token, its marker
  (``Ġ``, ``▁``, ``##``) dropped, is searched for in the text (case-insensitively) from
  where the previous one ended; found, it gets those offsets and the offsets rule applies;
- *markers* (when a token cannot be located, e.g. an unknown token): a token starting with
  ``Ġ`` (byte-level BPE) or ``▁`` (SentencePiece) starts a word, one starting with ``##``
  (WordPiece) continues the previous one, a marker alone is a space (no word; the next
  token starts one), any other token continues the previous word when the sequence uses
  such markers and is a word of its own when it uses none.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import pairwise

import torch

from attnaudit.errors import AnalysisError

REDUCTIONS = ("sum", "max", "mean")
WORD_STARTS = ("Ġ", "▁")
CONTINUES = "##"


def words_from_offsets(text: str, offsets: Sequence[Sequence[int]] | torch.Tensor,
                       keep: Sequence[bool] | torch.Tensor | None = None) -> list[int]:
    """Per token its word index in ``text`` (whitespace-separated), or -1; see the module
    docstring. ``keep``: False on tokens to leave out whatever their offsets (padding)."""
    pairs = offsets.tolist() if isinstance(offsets, torch.Tensor) else list(offsets)
    kept = [True] * len(pairs) if keep is None else [bool(k) for k in keep]
    if len(kept) != len(pairs):
        raise AnalysisError(f"{len(pairs)} token offsets but {len(kept)} keep flags")
    word_at, word = [-1] * len(text), -1
    for i, char in enumerate(text):
        if not char.isspace():
            if i == 0 or text[i - 1].isspace():
                word += 1
            word_at[i] = word
    out = []
    for (start, end), use in zip(pairs, kept, strict=True):
        start, end = max(int(start), 0), min(int(end), len(text))
        first = next((word_at[i] for i in range(start, end) if word_at[i] >= 0), -1)
        out.append(first if use else -1)
    return out


def words_from_tokens(tokens: Sequence[str], keep: Sequence[bool] | torch.Tensor | None = None,
                      text: str | None = None) -> tuple[list[int], str]:
    """Per token its word index, or -1 where ``keep`` is False (padding, special tokens),
    and the rule used: ``located`` when every kept token is found in ``text``, else
    ``markers`` (module docstring)."""
    kept = [True] * len(tokens) if keep is None else [bool(k) for k in keep]
    if len(kept) != len(tokens):
        raise AnalysisError(f"{len(tokens)} tokens but {len(kept)} keep flags")
    if text is not None and (located := _locate(text, tokens, kept)) is not None:
        return words_from_offsets(text, located, kept), "located"
    return _marker_words(tokens, kept), "markers"


def _locate(text: str, tokens: Sequence[str], kept: Sequence[bool]
            ) -> list[tuple[int, int]] | None:
    """Offsets of the kept tokens found in order in ``text``, or None if one is not found."""
    lowered, at, out = text.lower(), 0, []
    for token, use in zip(tokens, kept, strict=True):
        piece = _bare(str(token)).lower()
        if not use or not piece.strip():
            out.append((at, at))
            continue
        start = lowered.find(piece, at)
        if start < 0:
            return None
        at = start + len(piece)
        out.append((start, at))
    return out


def _bare(token: str) -> str:
    """A token without its word-start or continuation marker."""
    return token[len(CONTINUES):] if token.startswith(CONTINUES) else token.lstrip(
        "".join(WORD_STARTS))


def _marker_words(tokens: Sequence[str], kept: Sequence[bool]) -> list[int]:
    marked = any(str(t).startswith(WORD_STARTS) or str(t).startswith(CONTINUES)
                 for t, use in zip(tokens, kept, strict=True) if use)
    out, word, fresh = [], -1, True
    for token, use in zip(tokens, kept, strict=True):
        text = str(token)
        if not use or not _bare(text).strip():  # left out, or a marker alone (a space)
            out.append(-1)
            fresh = fresh or bool(use)
            continue
        starts = fresh or text.startswith(WORD_STARTS) or not marked
        if word < 0 or (starts and not text.startswith(CONTINUES)):
            word += 1
        fresh = False
        out.append(word)
    return out


def span_groups(n_keys: int, spans: Iterable[tuple[int, int]],
                offsets: Sequence[Sequence[int]] | torch.Tensor | None = None) -> torch.Tensor:
    """Long (n_keys,): the index of the span each key falls in, or -1.

    spans: half-open ``(start, end)`` pairs, not overlapping: token positions, or, with
    ``offsets`` (per token ``(start, end)`` characters, as in
    :func:`~attnaudit.analysis.expectations.keys_from_char_spans`), character ranges a
    token's range overlaps.
    """
    wanted = [(int(s), int(e)) for s, e in spans]
    if any(not 0 <= s <= e for s, e in wanted):
        raise AnalysisError(f"spans must be (start, end) pairs with 0 <= start <= end: {wanted}")
    ordered = sorted(wanted)
    if any(a[1] > b[0] for a, b in pairwise(ordered)):
        raise AnalysisError(f"spans overlap: {wanted}; a key can be in one span only")
    groups = torch.full((n_keys,), -1, dtype=torch.long)
    if offsets is None:
        for index, (start, end) in enumerate(wanted):
            groups[start:min(end, n_keys)] = index
        return groups
    pairs = offsets.tolist() if isinstance(offsets, torch.Tensor) else list(offsets)
    for key, (t_start, t_end) in enumerate(pairs[:n_keys]):
        groups[key] = next((index for index, (s, e) in enumerate(wanted)
                            if max(int(t_start), s) < min(int(t_end), e)), -1)
    return groups


def aggregate(values: torch.Tensor, groups: torch.Tensor | Sequence[int],
              n_groups: int | None = None, reduce: str = "sum") -> torch.Tensor:
    """Fold the key axis of ``values`` (..., keys) into groups: (..., n_groups).

    groups: long (keys,) or (B, keys) when ``values`` is (B, ..., keys) — one map per
    example; -1 drops a key. n_groups: default one more than the largest index.
    reduce: ``sum``, ``max`` or ``mean`` (module docstring). The result is float64 for
    float64 values, else float32.
    """
    if reduce not in REDUCTIONS:
        raise AnalysisError(f"reduce must be one of {', '.join(REDUCTIONS)}, got {reduce!r}")
    groups = torch.as_tensor(groups, dtype=torch.long, device=values.device)
    if groups.shape[-1] != values.shape[-1] or groups.ndim not in (1, 2):
        raise AnalysisError(f"groups {tuple(groups.shape)} must be (keys,) or (batch, keys) "
                            f"for values {tuple(values.shape)}")
    if groups.ndim == 2:
        if groups.shape[0] != values.shape[0]:
            raise AnalysisError(f"groups for {groups.shape[0]} examples, values for "
                                f"{values.shape[0]}")
        groups = groups.reshape(groups.shape[0], *[1] * (values.ndim - 2), groups.shape[-1])
    n_groups = int(groups.max()) + 1 if n_groups is None else n_groups
    dtype = torch.float64 if values.dtype == torch.float64 else torch.float32
    values = values.to(dtype)
    index = groups.where(groups >= 0, n_groups).expand_as(values)  # -1: a dropped bucket
    shape = (*values.shape[:-1], n_groups + 1)
    if reduce == "max":
        out = torch.full(shape, -torch.inf, dtype=dtype, device=values.device)
        out = out.scatter_reduce(-1, index, values, "amax", include_self=True)
    else:
        out = torch.zeros(shape, dtype=dtype, device=values.device).scatter_add(-1, index,
                                                                              values)
    counts = torch.zeros(shape, dtype=dtype, device=values.device).scatter_add(
        -1, index, torch.ones_like(values))
    if reduce == "mean":
        out = out / counts
    elif reduce == "max":
        out = out.masked_fill(counts == 0, torch.nan)
    return out[..., :n_groups]


def group_labels(tokens: Sequence[object], groups: Sequence[int] | torch.Tensor,
                 n_groups: int | None = None) -> list[str]:
    """Each group's tokens joined, word-start markers dropped (``Ġin`` ``g`` -> ``ing``)."""
    groups = [int(g) for g in (groups.tolist() if isinstance(groups, torch.Tensor) else groups)]
    n_groups = max(groups, default=-1) + 1 if n_groups is None else n_groups
    parts: list[list[str]] = [[] for _ in range(n_groups)]
    for token, group in zip(tokens, groups, strict=True):
        if group >= 0:
            parts[group].append(_bare(str(token)))
    return ["".join(p) for p in parts]
