"""A Hugging Face checkpoint's tokenizer, checked before an audit relies on it.

A checkpoint folder without tokenizer files can still load *a* tokenizer (a default one for
the architecture) that turns every source into nothing but special tokens (``<s> </s>``):
the audit would then measure attention over no real input and call it healthy. Both are
refused here, naming the folder, an example line and the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnaudit.errors import TokenizerError

# Files one of which every saved Hugging Face tokenizer writes.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt",
                   "spiece.model", "sentencepiece.bpe.model", "source.spm",
                   "vocab-src.json", "tokenizer.model")



def check_tokenizer_files(model_dir: Path) -> None:
    """Refuse a checkpoint folder that holds none of :data:`TOKENIZER_FILES`."""
    if not any((model_dir / name).is_file() for name in TOKENIZER_FILES):
        raise TokenizerError(
            f"{model_dir} has no tokenizer files (none of {', '.join(TOKENIZER_FILES[:4])}, "
            "...): save the tokenizer the model was trained with into it "
            "(tokenizer.save_pretrained(DIR))")


def check_tokenization(model_dir: Path, tokenizer: Any, sources: Sequence[str]) -> int:
    """The number of sources the tokenizer turns into special tokens only; refuses the
    data when that is every source (the example shown is the first source)."""
    specials = set(tokenizer.all_special_ids)
    encoded = tokenizer(list(sources))["input_ids"]
    empty = [i for i, ids in enumerate(encoded) if set(ids) <= specials]
    if len(empty) == len(sources):
        shown = tokenizer.convert_ids_to_tokens(encoded[0])
        raise TokenizerError(
            f"the tokenizer of {model_dir} turns every source into special tokens only "
            f"(line 1, {sources[0][:60]!r} -> {shown}): it does not know this text; use "
            "the tokenizer the model was trained with")
    return len(empty)
