"""Hugging Face models as targets: :func:`~attnaudit.targets.hf.loading.from_hf`, the
encoder-decoder and decoder-only adapters, key/value caches, tokenizer checks (transformers
is imported only when a model is loaded)."""
