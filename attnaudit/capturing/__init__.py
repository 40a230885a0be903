"""Capture adapters: softmax, SDPA, nn.MultiheadAttention, Hugging Face backends, tap."""

from attnaudit.capturing.recorder import Capture, Edit, capture
from attnaudit.capturing.tap import tap

__all__ = ["Capture", "Edit", "capture", "tap"]
