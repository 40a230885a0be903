"""Targets: what is audited. The contract in its two families (:class:`AuditTarget`:
:class:`Seq2SeqTarget`, :class:`DecoderOnlyTarget`; :class:`Batch`, :class:`Expectation`;
:mod:`attnaudit.targets.contract`), its checks, the audit data and data
files, placement on a device or dtype, plugin loading (:func:`load_target`), and the Hugging
Face adapters in :mod:`attnaudit.targets.hf` (:func:`from_hf`; transformers is imported only
when a model is loaded)."""

from attnaudit.targets.contract import (
    AuditTarget,
    Batch,
    DecoderOnlyTarget,
    Expectation,
    Seq2SeqTarget,
    select_state,
)
from attnaudit.targets.hf.loading import from_hf
from attnaudit.targets.loading import load_target
from attnaudit.targets.placement import place, placed, resolve_device, resolve_dtype

__all__ = ["AuditTarget", "Batch", "DecoderOnlyTarget", "Expectation", "Seq2SeqTarget",
           "from_hf", "load_target", "place", "placed", "resolve_device", "resolve_dtype",
           "select_state"]
