"""Capture adapters: softmax, SDPA, nn.MultiheadAttention, Hugging Face backends, tap; and the
table of model facts they read (:mod:`attnaudit.capturing.model_facts`)."""

from attnaudit.capturing.beams import beam_path, beam_records
from attnaudit.capturing.model_facts import (
    ModelFacts,
    register_model_facts,
    unregister_model_facts,
)
from attnaudit.capturing.recorder import Capture, Edit, capture
from attnaudit.capturing.tap import tap

__all__ = ["Capture", "Edit", "ModelFacts", "beam_path", "beam_records", "capture",
           "register_model_facts", "tap", "unregister_model_facts"]
