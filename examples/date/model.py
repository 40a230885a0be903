"""LSTM encoder-decoder with Bahdanau-style additive cross-attention (the date model).

Shape ledger (B batch, n source length, d_e = d_d = d_a = 128, E = 32):
    encoder memory H  (B, n, d_e)     keys K = H W_k   (B, n, d_a)
    query s_{t-1}     (B, d_d)        scores           (B, n)
    weights           (B, n)          context c_t      (B, d_e)
The decoder advances one target step at a time: attention reads with the previous
decoder state, the LSTM cell consumes [embed(y_{t-1}); c_t], and the output layer
predicts from [s_t; c_t]. Attention is computed in :meth:`attend`, a plain method
called from the step loop, exactly as hand-written research code tends to do it.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from .data import BOS, PAD, make_splits, vocabularies

CHECKPOINT = Path(__file__).with_name("date_attention.pt")
TARGET_STEPS = 11  # ten ISO characters and </s>

State = tuple[torch.Tensor, torch.Tensor]
Step = Callable[[torch.Tensor, State], tuple[torch.Tensor, State]]


def encode_packed(embed: nn.Embedding, encoder: nn.LSTM, src: torch.Tensor,
                  lengths: torch.Tensor) -> tuple[torch.Tensor, State]:
    """Run a one-layer batch-first LSTM over embedded right-padded sources, padding skipped.

    src (B, n) ids, lengths (B,) -> outputs (B, n, d) (zero on padding) and the final
    (h, c), each (1, B, d), taken at each source's last real character.
    """
    packed = pack_padded_sequence(embed(src), lengths.cpu(), batch_first=True,
                                  enforce_sorted=False)
    out, state = encoder(packed)
    outputs, _ = pad_packed_sequence(out, batch_first=True, total_length=src.shape[1])
    return outputs, state


def greedy_decode(step: Step, state: State, batch: int, steps: int,
                  device: torch.device) -> torch.Tensor:
    """Feed ``<s>``, then each argmax back into ``step``: -> emitted ids (B, steps).

    ``step(prev (B,), state) -> (logits (B, V_tgt), new state)`` is one decoder step.
    """
    prev = torch.full((batch,), BOS, dtype=torch.long, device=device)
    emitted = []
    for _ in range(steps):
        logits, state = step(prev, state)
        prev = logits.argmax(-1)
        emitted.append(prev)
    return torch.stack(emitted, dim=1)


class DateAttentionModel(nn.Module):
    def __init__(self, src_vocab: int = 37, tgt_vocab: int = 14, embed: int = 32,
                 hidden: int = 128, align: int = 128) -> None:
        super().__init__()
        self.src_embed = nn.Embedding(src_vocab, embed, padding_idx=PAD)
        self.encoder = nn.LSTM(embed, hidden, batch_first=True)
        self.tgt_embed = nn.Embedding(tgt_vocab, embed)
        self.decoder = nn.LSTMCell(embed + hidden, hidden)
        self.query_proj = nn.Linear(hidden, align, bias=False)
        self.key_proj = nn.Linear(hidden, align, bias=False)
        self.score_vec = nn.Linear(align, 1, bias=False)
        self.out = nn.Linear(2 * hidden, tgt_vocab)

    def encode(self, src: torch.Tensor, lengths: torch.Tensor):
        """src (B, n) -> memory (B, n, d_e), valid (B, n) bool, final (h, c) each (B, d_d)."""
        memory, (h, c) = encode_packed(self.src_embed, self.encoder, src, lengths)
        return memory, src != PAD, (h[0], c[0])

    def attend(self, query: torch.Tensor, memory: torch.Tensor, keys: torch.Tensor,
               valid: torch.Tensor) -> torch.Tensor:
        """Additive attention: query (B, d_d) -> context (B, d_e); weights (B, n)."""
        feats = torch.tanh(keys + self.query_proj(query)[:, None, :])  # (B, n, d_a)
        scores = self.score_vec(feats).squeeze(-1).masked_fill(~valid, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        return torch.bmm(weights[:, None, :], memory).squeeze(1)

    def step(self, prev: torch.Tensor, state, memory, keys, valid):
        """One decoder step: prev token (B,) -> logits (B, V_tgt), new state."""
        h, c = state
        context = self.attend(h, memory, keys, valid)
        h, c = self.decoder(torch.cat([self.tgt_embed(prev), context], dim=-1), (h, c))
        return self.out(torch.cat([h, context], dim=-1)), (h, c)

    def forward(self, src: torch.Tensor, lengths: torch.Tensor,
                tgt_in: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits (B, T, V_tgt) for decoder inputs tgt_in (B, T)."""
        memory, valid, state = self.encode(src, lengths)
        keys = self.key_proj(memory)
        logits = []
        for t in range(tgt_in.shape[1]):
            step_logits, state = self.step(tgt_in[:, t], state, memory, keys, valid)
            logits.append(step_logits)
        return torch.stack(logits, dim=1)

    @torch.no_grad()
    def greedy(self, src: torch.Tensor, lengths: torch.Tensor,
               steps: int = TARGET_STEPS) -> torch.Tensor:
        """Greedy decode: (B, n) -> emitted ids (B, steps), ``<s>`` excluded."""
        memory, valid, state = self.encode(src, lengths)
        keys = self.key_proj(memory)
        step = partial(self.step, memory=memory, keys=keys, valid=valid)
        return greedy_decode(step, state, src.shape[0], steps, src.device)


def load_model(path: Path = CHECKPOINT) -> DateAttentionModel:
    """The committed trained checkpoint, in eval mode."""
    src_vocab, tgt_vocab = vocabularies(make_splits())
    model = DateAttentionModel(len(src_vocab), len(tgt_vocab))
    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return model.eval()
