"""Independent reference for the toy targets: their attention recomputed in numpy."""

from __future__ import annotations

import numpy as np

from tests.helpers.toys.masking import BOS, EOS, PAD, SOURCES, make_target


def toy_weights(masking: str, empty_source: bool = False):
    """Per batch: (weights (B, T, n) as the model's softmax returns them, source pad (B, n),
    counted steps (B, T): steps up to and including the first EOS)."""
    sources = (*SOURCES, []) if empty_source else SOURCES
    target = make_target(masking, sources)
    embed_src = target.model.src_embed.weight.detach().double().numpy()
    embed_tgt = target.model.tgt_embed.weight.detach().double().numpy()
    out = []
    for batch in target.iter_batches():
        emitted = target.greedy(batch).numpy()
        src = batch.source_ids.numpy()
        tgt_in = np.concatenate([np.full((len(src), 1), BOS), emitted[:, :-1]], axis=1)
        scores = np.einsum("btd,bnd->btn", embed_tgt[tgt_in], embed_src[src])
        scores /= np.sqrt(embed_src.shape[1])
        pad = np.broadcast_to((src == PAD)[:, None, :], scores.shape)
        if masking == "zero_fill":
            scores = np.where(pad, 0.0, scores)
        elif masking == "correct":
            scores = np.where(pad, -np.inf, scores)
        with np.errstate(invalid="ignore"):
            top = scores.max(-1, keepdims=True)
            weights = np.exp(scores - top)
            weights /= weights.sum(-1, keepdims=True)
        counted = np.zeros(emitted.shape, dtype=bool)
        for b, row in enumerate(emitted.tolist()):
            stop = row.index(EOS) + 1 if EOS in row else len(row)
            counted[b, :stop] = True
        out.append((weights, src == PAD, counted))
    return out


def toy_rows(masking: str, empty_source: bool = False, worst: bool = False):
    """(failing rows, counted rows): rows with masked mass > 1e-6, or NaN rows for
    ``empty_source``; with ``worst``, the largest masked mass instead."""
    bad = total = 0
    largest = 0.0
    for weights, pad, counted in toy_weights(masking, empty_source):
        masked = np.where(pad[:, None, :], weights, 0.0).sum(-1)[counted]
        total += int(counted.sum())
        if empty_source:
            bad += int(np.isnan(weights).any(-1)[counted].sum())
        else:
            bad += int((masked > 1e-6).sum())
            largest = max(largest, float(masked.max()))
    return largest if worst else (bad, total)

