"""The date BART as an audit target: the data and expectation of
``attnaudit_examples.date.target``.

The character tokenizer makes source token i source character i (then ``</s>``), so the
year characters are the same key positions as in the LSTM model.
"""

from __future__ import annotations

from pathlib import Path

from attnaudit.targets.contract import Expectation, Seq2SeqTarget
from attnaudit.targets.hf.loading import from_hf

from ..date.data import SEED, YEAR_CHARS, make_splits
from ..date.gold import gold_lines
from ..date.target import AUDIT_SOURCES, year_keys
from .model import MAX_NEW_TOKENS, MODEL_DIR

AUDIT_TSV = Path(__file__).with_name("audit.tsv")


def write_audit_tsv(limit: int = AUDIT_SOURCES) -> None:
    """``audit.tsv``: the first 400 unambiguous validation pairs, ``source<TAB>iso``."""
    pairs = make_splits().unambiguous("valid", limit)
    AUDIT_TSV.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")


def make_target() -> Seq2SeqTarget:
    target = from_hf(MODEL_DIR, AUDIT_TSV, max_new_tokens=MAX_NEW_TOKENS, name="date_transformer")
    return target.with_options(
        expectations=(Expectation("source year", year_keys, rows=YEAR_CHARS),),
        seed=SEED,
        gold_alignments=gold_lines(target.target_tokens, target.eos_id),
        description=(
            "Hugging Face BART (2 + 2 layers, 4 heads, character tokenizer) normalising "
            "free-form English dates to ISO 8601 (examples/date_transformer); audit data: "
            "unambiguous validation sources, in order."
        ),
    )


if __name__ == "__main__":
    write_audit_tsv()
