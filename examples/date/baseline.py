"""The seed's fixed-state baseline: the date LSTM encoder-decoder without attention.

Shape ledger (B batch, n source length, T target length, d = 128, E = 32):
    source ids        (B, n)          embedded         (B, n, E)
    encoder final     (h, c) each (1, B, d)            the only thing the decoder sees
    decoder inputs    (B, T)          decoder states   (B, T, d)
    logits            (B, T, V_tgt)
The encoder's final state initialises the decoder and is the whole hand-off: the decoder
never reads the encoder's per-character outputs. Teacher forcing is one fused
``nn.LSTM`` call over the target sequence; greedy decoding steps the same LSTM one token
at a time. Same data, widths, padding handling and schedule as the attention model
(``model.py``); 169,326 parameters against its 269,550.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from .data import PAD, make_splits, vocabularies
from .model import TARGET_STEPS, State, encode_packed, greedy_decode

BASELINE_CHECKPOINT = Path(__file__).with_name("date_baseline.pt")


class DateBaselineModel(nn.Module):
    def __init__(self, src_vocab: int = 37, tgt_vocab: int = 14, embed: int = 32,
                 hidden: int = 128) -> None:
        super().__init__()
        self.src_embed = nn.Embedding(src_vocab, embed, padding_idx=PAD)
        self.encoder = nn.LSTM(embed, hidden, batch_first=True)
        self.tgt_embed = nn.Embedding(tgt_vocab, embed)
        self.decoder = nn.LSTM(embed, hidden, batch_first=True)
        self.out = nn.Linear(hidden, tgt_vocab)

    def encode(self, src: torch.Tensor, lengths: torch.Tensor) -> State:
        """src (B, n), lengths (B,) -> the decoder's initial (h, c), each (1, B, d)."""
        _, state = encode_packed(self.src_embed, self.encoder, src, lengths)
        return state

    def step(self, prev: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """One decoder step: prev token (B,) -> logits (B, V_tgt), new state."""
        out, state = self.decoder(self.tgt_embed(prev)[:, None, :], state)  # (B, 1, d)
        return self.out(out[:, 0]), state

    def forward(self, src: torch.Tensor, lengths: torch.Tensor,
                tgt_in: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits (B, T, V_tgt) for decoder inputs tgt_in (B, T), one call."""
        out, _ = self.decoder(self.tgt_embed(tgt_in), self.encode(src, lengths))  # (B, T, d)
        return self.out(out)

    @torch.no_grad()
    def greedy(self, src: torch.Tensor, lengths: torch.Tensor,
               steps: int = TARGET_STEPS) -> torch.Tensor:
        """Greedy decode: (B, n) -> emitted ids (B, steps), ``<s>`` excluded."""
        return greedy_decode(self.step, self.encode(src, lengths), src.shape[0], steps,
                             src.device)


def load_baseline(path: Path = BASELINE_CHECKPOINT) -> DateBaselineModel:
    """The committed trained baseline checkpoint, in eval mode."""
    src_vocab, tgt_vocab = vocabularies(make_splits())
    model = DateBaselineModel(len(src_vocab), len(tgt_vocab))
    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return model.eval()
