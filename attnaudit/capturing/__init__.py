"""Capture adapters: softmax, SDPA, nn.MultiheadAttention, Hugging Face backends, tap."""

from attnaudit.capturing.beams import beam_path, beam_records
from attnaudit.capturing.recorder import Capture, Edit, capture
from attnaudit.capturing.tap import tap

__all__ = ["Capture", "Edit", "beam_path", "beam_records", "capture", "tap"]
