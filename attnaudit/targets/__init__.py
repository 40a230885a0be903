"""Targets: what is audited. The contract (:class:`Seq2SeqTarget`, :class:`Batch`,
:class:`Expectation`), its checks, data files, placement on a device or dtype, plugin
loading, and the Hugging Face adapters in :mod:`attnaudit.targets.hf`."""
