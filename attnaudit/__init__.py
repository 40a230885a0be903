"""attnaudit: audit the attention of sequence-to-sequence models.

Capture attention weights from an unmodified model, replace them inside the forward pass,
and test what they do and do not explain.
"""

from attnaudit.capturing import Capture, Edit, capture, tap
from attnaudit.errors import (
    AttnauditError,
    CaptureError,
    EditError,
    NoAttentionFound,
    SiteNotFound,
)
from attnaudit.record import AttentionCall, AttentionRecord, Site

__version__ = "0.1.0"

__all__ = [
    "AttentionCall",
    "AttentionRecord",
    "AttnauditError",
    "Capture",
    "CaptureError",
    "Edit",
    "EditError",
    "NoAttentionFound",
    "Site",
    "SiteNotFound",
    "capture",
    "tap",
]
