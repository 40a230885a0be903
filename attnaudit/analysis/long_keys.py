"""Long key axes (a prompt of 1k-32k tokens): the blocks a map's keys are averaged into and
the exact keys kept beside those block means.

Past :data:`~attnaudit.analysis.example_maps.MAX_MAP_SIDE` keys, a map's key axis is cut
into consecutive blocks of :func:`block_size` tokens (a power of two, so that there are at
most :data:`MAX_BLOCKS` blocks; the last one may be shorter) and each cell holds the
block's mean weight. Beside those block means every exact query row keeps, at the model's
own precision read as float32, its :data:`TOP_K` largest keys (:class:`TopKeys`), its weight
on key 0 (the first real key: the prompt's first token, where attention sinks sit) and, when
the call had sink columns, its weight on them. The explorer zooms into a block at token
resolution from these: kept keys exact, every other key the block mean, marked as such.

Memory: each call's rows are reduced to blocks and top keys as they arrive, so an example
keeps ``heads x rows x (MAX_BLOCKS + 2 TOP_K + 2)`` numbers per site, never its full rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

MAX_BLOCKS = 128  # blocks of a long key axis: 8k keys are 128 blocks of 64 tokens
TOP_K = 8  # exact keys kept per query row beside the block means


def block_size(keys: int) -> int:
    """Tokens per block of a long key axis of ``keys`` positions: the least power of two
    giving at most :data:`MAX_BLOCKS` blocks."""
    size = 1
    while -(-keys // size) > MAX_BLOCKS:
        size *= 2
    return size


def block_bins(keys: int) -> torch.Tensor:
    """(keys,) long: each key's block (:func:`block_size`)."""
    return torch.arange(keys) // block_size(keys)


@dataclass
class TopKeys:
    """The exact keys kept per query row of a map with a long key axis (module docstring).

    block: tokens per block of the map's key axis. tokens: a label per key position (the
    map's key labels name the blocks). index: int64 (heads, queries, k), the top keys'
    positions on the token axis, largest weight first. value: float32 (heads, queries, k),
    their weights. first: float32 (heads, queries), the weight on key 0. sink: float32
    (heads, queries), the weight on the call's sink columns, or None (the call had none).
    """

    block: int
    tokens: list[str]
    index: np.ndarray
    value: np.ndarray
    first: np.ndarray
    sink: np.ndarray | None = None


@dataclass
class TopKeysBuilder:
    """One site's top keys gathered call by call, on the map's query rows.

    index, value: (heads, rows, k) as in :class:`TopKeys`; first, sink: (heads, rows), sink
    NaN until a call with sink columns is seen.
    """

    index: torch.Tensor
    value: torch.Tensor
    first: torch.Tensor
    sink: torch.Tensor
    has_sink: bool = False

    @classmethod
    def empty(cls, heads: int, rows: int, keys: int) -> TopKeysBuilder:
        k = min(TOP_K, keys)
        return cls(torch.zeros(heads, rows, k, dtype=torch.long), torch.zeros(heads, rows, k),
                   torch.zeros(heads, rows), torch.full((heads, rows), torch.nan))

    def add(self, rows: torch.Tensor, at: torch.Tensor, sink: torch.Tensor | None) -> None:
        """Rows (H, q, K) of the map's keys (any dtype or device) at map rows ``at`` (q,);
        ``sink``: their (H, q, 1) sink weight or None."""
        full = rows.float()
        value, index = torch.topk(full, self.index.shape[2], dim=-1)
        self.value[:, at] = value.cpu()
        self.index[:, at] = index.cpu()
        self.first[:, at] = full[:, :, 0].cpu()
        if sink is not None:
            self.sink[:, at] = sink[..., 0].float().cpu()
            self.has_sink = True

    def keys(self, block: int, tokens: list[str]) -> TopKeys:
        return TopKeys(block, tokens, self.index.numpy(), self.value.numpy(),
                       self.first.numpy(), self.sink.numpy() if self.has_sink else None)
