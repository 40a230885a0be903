"""Hugging Face models as targets: seq2seq and decoder-only adapters, key/value caches,
tokenizer checks (transformers is imported only when a model is loaded)."""
