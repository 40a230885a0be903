"""The memory budget and the query blocks explicit attention is computed in.

Where capture computes attention weights itself (``F.scaled_dot_product_attention``, also
Hugging Face's ``sdpa`` backend), a call whose weights would exceed the budget is computed
in blocks of query rows: each block's scores, mask, softmax and weighted read are made, the
block is recorded (or handed to ``capture(on_call=...)``) and edited, and its output rows
are written before the next block starts. A block holds at most
``max_memory // (BYTES_PER_WEIGHT * batch * heads * keys)`` query rows (at least one).
The same budget sizes the interventions' chunks (``--max-memory``,
:mod:`attnaudit.interventions.memory`).
"""

from __future__ import annotations

import re

from attnaudit.errors import CaptureOptionError

DEFAULT_MAX_MEMORY = 1 << 30  # bytes, unless the caller gives a budget
# Bytes alive per attention weight of a block at once: the float32 scores, weights and
# their masked copy capture makes (12), and the float64 copy, eligibility, eligible
# weights and per-row temporaries a streaming analysis makes of the block (36).
BYTES_PER_WEIGHT = 48

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 10**6,
          "mib": 1 << 20, "g": 1 << 30, "gb": 10**9, "gib": 1 << 30}


def parse_memory(text: str | int) -> int:
    """``"2GiB"``, ``"512MB"``, ``"800M"`` or a number of bytes -> bytes (> 0)."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise CaptureOptionError(f"memory must look like 2GiB, 512MB, 800M or a byte count, "
                                     f"got {text!r}")
        value = int(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise CaptureOptionError(f"memory budget must be positive, got {text!r}")
    return value


def block_rows(weights_per_row: int, max_memory: int) -> int:
    """Query rows per block: as many as ``max_memory`` bytes hold at
    :data:`BYTES_PER_WEIGHT` per weight, at least 1. ``weights_per_row``: batch x heads x
    keys, the weights one query row has."""
    return max(max_memory // (BYTES_PER_WEIGHT * max(weights_per_row, 1)), 1)


def query_blocks(queries: int, rows: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of each block of at most ``rows`` of ``queries`` query rows."""
    return [(start, min(start + rows, queries)) for start in range(0, queries, rows)] or [(0, 0)]
