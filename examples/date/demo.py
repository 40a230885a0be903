"""Capture the date model's attention and set what it shows beside the published numbers.

    attnaudit demo            # or: python -m examples.date.demo

Decodes the first 400 unambiguous validation sources greedily under ``attnaudit.capture``
(the model is unmodified: attention is found in its ``attend`` method), then reports the
share of the first four emitted characters' attention mass on the source-year characters,
how often their top-weighted key lies there, masked mass on padding, and exact match on
the 437 unambiguous test sources. Finally it draws the seed's example as a text heatmap.
"""

from __future__ import annotations

import torch

import attnaudit
from examples.date.data import YEAR_CHARS, encode_sources, make_splits, vocabularies, year_span
from examples.date.model import load_model

SEED_YEAR_MASS, SEED_YEAR_HIT, SEED_TEST_EM = 0.975, 0.997, 1.0
SHADES = " .:-=+*#%@"


def year_region(sources: list[str], n_keys: int) -> torch.Tensor:
    """Bool (B, n_keys): True on each source's year characters."""
    region = torch.zeros(len(sources), n_keys, dtype=torch.bool)
    for row, source in enumerate(sources):
        region[row, list(year_span(source))] = True
    return region


def text_heatmap(weights: torch.Tensor, source: str, emitted: str) -> str:
    """Rows: emitted characters; columns: source characters; darker = more weight."""
    lines = ["      " + "".join("·" if c == " " else c for c in source)]
    for row, char in enumerate(emitted):
        cells = "".join(SHADES[min(int(w * len(SHADES)), len(SHADES) - 1)]
                        for w in weights[row, : len(source)].tolist())
        lines.append(f"  {char}   {cells}   max {weights[row].max():.3f}")
    return "\n".join(lines)


def main() -> None:
    splits = make_splits()
    src_vocab, tgt_vocab = vocabularies(splits)
    model = load_model()
    sources = [s for s, _ in splits.unambiguous("valid", 400)]
    src, lengths = encode_sources(src_vocab, sources)
    with torch.no_grad(), attnaudit.capture(model, kinds={"attend": "cross"}) as cap:
        emitted = model.greedy(src, lengths)
    print(f"sites found: {cap.sites}")
    rec = cap.records["attend:cross"]
    weights = rec.weights[:, 0]  # (400, 11 steps, n keys): one head
    print(f"weights {tuple(rec.weights.shape)} (batch, heads, queries, keys), "
          f"{len(rec.calls)} decoder steps stacked on the query axis")
    masked_mass = (weights * ~rec.key_mask[:, 0]).sum(-1).max().item()
    row_sum_error = (weights.sum(-1) - 1).abs().max().item()
    print(f"max masked mass on padding {masked_mass:.2e}, max row-sum error {row_sum_error:.2e}")

    first = weights[:, :YEAR_CHARS]  # the year is emitted first
    region = year_region(sources, weights.shape[-1])[:, None, :]
    year_mass = (first * region).sum(-1).mean().item()
    year_hit = region.expand_as(first).gather(-1, first.argmax(-1, keepdim=True)).float().mean()
    test = splits.unambiguous("test")
    test_src, test_len = encode_sources(src_vocab, [s for s, _ in test])
    decoded = [tgt_vocab.decode(row.tolist()) for row in model.greedy(test_src, test_len)]
    exact = sum(d == t for d, (_, t) in zip(decoded, test, strict=True)) / len(test)
    print(f"\n{'':52}{'attnaudit':>10}{'seed':>8}")
    print(f"{'year-region mass, first 4 rows (400 valid)':52}{year_mass:>10.1%}"
          f"{SEED_YEAR_MASS:>8.1%}")
    print(f"{'top-weight hit rate in year region':52}{year_hit.item():>10.1%}{SEED_YEAR_HIT:>8.1%}")
    print(f"{f'exact match, {len(test)} unambiguous test sources':52}{exact:>10.1%}"
          f"{SEED_TEST_EM:>8.1%}")
    print(f"\n{sources[0]} -> {tgt_vocab.decode(emitted[0].tolist())}")
    print(text_heatmap(weights[0], sources[0], tgt_vocab.decode(emitted[0].tolist())))
    print("\nAttention weights are internal allocation weights: not calibrated confidence and "
          "not, by themselves, a causal explanation.")


if __name__ == "__main__":
    main()
