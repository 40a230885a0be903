"""The date-normalisation task: free-form English dates -> ISO 8601.

The generator, seed and 8,000/500/500 split reproduce the textbook benchmark exactly,
so numbers measured here can be set beside the published ones.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

MONTHS = [
    "january", "february", "march", "april", "may", "june",
    "july", "august", "september", "october", "november", "december",
]  # fmt: skip
DAYS = dict(zip(MONTHS, [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], strict=True))
SEED = 6050
PAD, BOS, EOS = 0, 1, 2
SPECIALS = ("<pad>", "<s>", "</s>")
YEAR_CHARS = 4


def make_date(rng: random.Random) -> tuple[str, str]:
    """Draw one (source, ISO target) pair; the draw order is part of the benchmark."""
    mo = rng.randrange(12)
    d = rng.randrange(1, DAYS[MONTHS[mo]] + 1)
    y = rng.randrange(1950, 2026)
    iso = f"{y:04d}-{mo + 1:02d}-{d:02d}"
    style = rng.random()
    if style < 0.35:
        src = f"{MONTHS[mo]} {d}, {y}"
    elif style < 0.6:
        src = f"{d} {MONTHS[mo]} {y}"
    elif rng.random() < 0.7:
        src = f"{mo + 1:02d}/{d:02d}/{y}"  # US convention: mm/dd
    else:
        src = f"{d:02d}/{mo + 1:02d}/{y}"  # EU convention: dd/mm
    return src, iso


def is_ambiguous(source: str) -> bool:
    """True for numeric dates whose two leading fields could both be a month."""
    if "/" not in source:
        return False
    first, second, _ = source.split("/")
    return int(first) <= 12 and int(second) <= 12


@dataclass(frozen=True)
class DateSplits:
    """The sealed 8,000 / 500 / 500 split of 9,000 distinct sources."""

    train: list[tuple[str, str]]
    valid: list[tuple[str, str]]
    test: list[tuple[str, str]]

    def unambiguous(self, split: str, limit: int | None = None) -> list[tuple[str, str]]:
        """The split's pairs whose source has one reading, in order (first ``limit``)."""
        pairs = [p for p in getattr(self, split) if not is_ambiguous(p[0])]
        return pairs[:limit]


def make_splits(seed: int = SEED) -> DateSplits:
    """Generate 9,000 distinct sources with duplicate-source rejection and split them."""
    rng = random.Random(seed)
    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    while len(pairs) < 9000:
        pair = make_date(rng)
        if pair[0] not in seen:
            seen.add(pair[0])
            pairs.append(pair)
    return DateSplits(train=pairs[:8000], valid=pairs[8000:8500], test=pairs[8500:])


class CharVocab:
    """Character vocabulary with ``<pad>``, ``<s>``, ``</s>`` at ids 0, 1, 2."""

    def __init__(self, chars: list[str]) -> None:
        self.itos = list(SPECIALS) + list(chars)
        self.stoi = {c: i for i, c in enumerate(self.itos)}

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, text: str) -> list[int]:
        unknown = sorted(set(text) - self.stoi.keys())
        if unknown:
            raise ValueError(f"characters outside the vocabulary: {unknown!r}")
        return [self.stoi[c] for c in text]

    def decode(self, ids: list[int]) -> str:
        """Characters up to the first ``</s>``; ``<pad>`` and ``<s>`` are skipped."""
        out = []
        for i in ids:
            if i == EOS:
                break
            if i > EOS:
                out.append(self.itos[i])
        return "".join(out)


def vocabularies(splits: DateSplits) -> tuple[CharVocab, CharVocab]:
    """Source and target vocabularies over all 9,000 pairs (37 and 14 symbols)."""
    pairs = splits.train + splits.valid + splits.test
    src = CharVocab(sorted(set("".join(s for s, _ in pairs))))
    tgt = CharVocab(sorted(set("".join(t for _, t in pairs))))
    return src, tgt


def encode_sources(vocab: CharVocab, sources: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded source ids ``(batch, src_len)`` and lengths ``(batch,)``."""
    ids = [vocab.encode(s) for s in sources]
    lengths = torch.tensor([len(x) for x in ids])
    out = torch.full((len(ids), int(lengths.max())), PAD, dtype=torch.long)
    for row, x in enumerate(ids):
        out[row, : len(x)] = torch.tensor(x)
    return out, lengths


def encode_targets(vocab: CharVocab, targets: list[str]) -> torch.Tensor:
    """Target ids ``(batch, tgt_len + 2)``: ``<s>`` chars ``</s>`` (ISO dates are fixed-length)."""
    return torch.tensor([[BOS, *vocab.encode(t), EOS] for t in targets])


def year_span(source: str) -> range:
    """Source character positions of the year: always the last four characters."""
    return range(len(source) - YEAR_CHARS, len(source))
