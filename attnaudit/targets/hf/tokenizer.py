"""A Hugging Face checkpoint's tokenizer, checked before an audit relies on it.

A checkpoint folder without tokenizer files can still load *a* tokenizer (a default one for
the architecture) that turns every source into nothing but special tokens (``<s> </s>``):
the audit would then measure attention over no real input and call it healthy. Both are
refused here, naming the folder, an example line and the fix. :func:`source_limit` says how
many source tokens the model can take, and how many sources that cuts.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnaudit.errors import TargetError, TokenizerError
from attnaudit.targets.checks import config_position_limit

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
    encoded = tokenizer(list(sources), verbose=False)["input_ids"]
    empty = [i for i, ids in enumerate(encoded) if set(ids) <= specials]
    if len(empty) == len(sources):
        shown = tokenizer.convert_ids_to_tokens(encoded[0])
        raise TokenizerError(
            f"the tokenizer of {model_dir} turns every source into special tokens only "
            f"(line 1, {sources[0][:60]!r} -> {shown}): it does not know this text; use "
            "the tokenizer the model was trained with")
    return len(empty)


def source_limit(tokenizer: Any, config: Any, sources: list[str],
                 max_source_tokens: int | None, reserved: int = 0) -> tuple[int | None, str]:
    """The source token limit (the smaller of ``max_source_tokens`` and the model's position
    limit less ``reserved`` positions; a config without a positive
    ``max_position_embeddings`` sets none) and a sentence on what truncation did; warns when
    sources are cut."""
    positions = config_position_limit(config)
    limits = [x for x in (max_source_tokens,
                          None if positions is None else positions - reserved)
              if x is not None]
    if not limits:
        return None, "sources were not truncated (no token limit known)"
    limit = min(limits)
    if limit < 1:
        raise TargetError(f"no room for the source: {positions} positions, {reserved} of "
                          "them for the output; lower max_new_tokens")
    # verbose=False: transformers would warn of "indexing errors" that the cut below avoids
    lengths = [len(ids) for ids in tokenizer(sources, verbose=False)["input_ids"]]
    cut = sum(n > limit for n in lengths)
    if not cut:
        return limit, f"no source was truncated (limit {limit} tokens; longest {max(lengths)})"
    what = (f"{cut} of {len(sources)} sources were longer than {limit} tokens and were "
            f"truncated to {limit} (longest {max(lengths)})")
    # source_limit <- an adapter's target() <- from_hf <- the caller the warning names
    warnings.warn(f"attnaudit: {what}", stacklevel=4)
    return limit, what


def special_token_ids(tokenizer: Any, pad_id: int | None, eos_id: int | None
                      ) -> tuple[int, ...]:
    """The ids no attribution or intervention should move weight to: padding, end of
    sequence, and the tokenizer's own beginning, classification and separator tokens."""
    return tuple(sorted({i for i in (pad_id, eos_id, tokenizer.bos_token_id,
                                     tokenizer.cls_token_id, tokenizer.sep_token_id)
                         if i is not None}))
