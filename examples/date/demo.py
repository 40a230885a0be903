"""Capture the date model's attention and set what it shows beside the published numbers.

    attnaudit demo            # or: python -m attnaudit_examples.date.demo

Decodes the first 400 unambiguous validation sources greedily under ``attnaudit.capture``
(the model is unmodified: attention is found in its ``attend`` method) and reports what was
captured and the masked mass on padding; then prints the seed's three numbers from the
alignment audit (``python -m attnaudit_examples.alignment_audit date``: the share of the
first four emitted characters' attention mass on the source-year characters, how often their
top-weighted key lies there, and exact match on the 437 unambiguous test sources). Finally
it draws the seed's example as a text heatmap.
"""

from __future__ import annotations

import torch

import attnaudit
from attnaudit.runtime.progress import advance, display, phase

from ..alignment_audit import audit_date, format_headline
from .data import encode_sources, make_splits, vocabularies
from .model import load_model

SHADES = " .:-=+*#%@"


def text_heatmap(weights: torch.Tensor, source: str, emitted: str) -> str:
    """Rows: emitted characters; columns: source characters; darker = more weight."""
    lines = ["      " + "".join("·" if c == " " else c for c in source)]
    for row, char in enumerate(emitted):
        cells = "".join(SHADES[min(int(w * len(SHADES)), len(SHADES) - 1)]
                        for w in weights[row, : len(source)].tolist())
        lines.append(f"  {char}   {cells}   max {weights[row].max():.3f}")
    return "\n".join(lines)


def main(progress: bool = True) -> None:
    """The demo; ``progress``: its progress display on stderr (results go to stdout)."""
    with display(2, enabled=progress, name="attnaudit demo", unit="steps"):
        phase("capture while decoding 400 sources")
        splits = make_splits()
        src_vocab, tgt_vocab = vocabularies(splits)
        model = load_model()
        sources = [s for s, _ in splits.unambiguous("valid", 400)]
        src, lengths = encode_sources(src_vocab, sources)
        with torch.no_grad(), attnaudit.capture(model, kinds={"attend": "cross"}) as cap:
            emitted = model.greedy(src, lengths)
        advance(1)
        phase("alignment audit on the test sources")
        headline = format_headline(audit_date())
        advance(1)
    print(f"sites found: {cap.sites}")
    rec = cap.records["attend:cross"]
    weights = rec.weights[:, 0]  # (400, 11 steps, n keys): one head
    print(f"weights {tuple(rec.weights.shape)} (batch, heads, queries, keys), "
          f"{len(rec.calls)} decoder steps stacked on the query axis")
    masked_mass = (weights * ~rec.key_mask[:, 0]).sum(-1).max().item()
    row_sum_error = (weights.sum(-1) - 1).abs().max().item()
    print(f"max masked mass on padding {masked_mass:.2e}, max row-sum error {row_sum_error:.2e}")

    print()
    print(headline)
    print(f"\n{sources[0]} -> {tgt_vocab.decode(emitted[0].tolist())}")
    print(text_heatmap(weights[0], sources[0], tgt_vocab.decode(emitted[0].tolist())))
    print("\nAttention weights are internal allocation weights: not calibrated confidence and "
          "not, by themselves, a causal explanation.")


if __name__ == "__main__":
    main()
