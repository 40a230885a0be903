"""attnaudit: audit the attention of sequence-to-sequence models.

Capture attention weights from an unmodified model, replace them inside the forward pass,
and test what they do and do not explain. The top level holds capture and the audit
target; the rest lives in subpackages: ``attnaudit.analysis`` (streaming analysers),
``attnaudit.audit`` (the validity audit), ``attnaudit.interventions`` (interventions,
attributions, agreement), ``attnaudit.report`` (HTML/CSV reports) and
``attnaudit.testing`` (a pytest helper).
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
from attnaudit.target import (
    Batch,
    Expectation,
    Seq2SeqTarget,
    TargetError,
    from_hf,
    load_target,
)

__version__ = "0.1.0"

__all__ = [
    "AttentionCall",
    "AttentionRecord",
    "AttnauditError",
    "Batch",
    "Capture",
    "CaptureError",
    "Edit",
    "EditError",
    "Expectation",
    "NoAttentionFound",
    "Seq2SeqTarget",
    "Site",
    "SiteNotFound",
    "TargetError",
    "capture",
    "from_hf",
    "load_target",
    "tap",
]
