"""attnaudit: audit the attention of sequence-to-sequence models.

Capture attention weights from an unmodified model, replace them inside the forward pass,
and test what they do and do not explain. The top level holds capture, the audit target,
:func:`audit` and its result :class:`Audit`; the rest lives in one subpackage per layer
(docs/architecture.md): ``capturing``, ``targets``, ``analysis`` (streaming analysers),
``runtime`` (processes, progress, output folders), ``interventions`` (weight and value
edits), ``validity`` (the validity pipeline, findings and the CI gate), ``attribution``
(Captum methods, leave-one-out, agreement), ``checklist``, ``alignments`` (word
alignments and their error rate), ``report`` (HTML/CSV),
``auditing`` (the orchestration) and ``cli``; ``attnaudit.testing`` is a pytest helper.
"""

from typing import Any

from attnaudit.capturing import Capture, Edit, beam_path, beam_records, capture, tap
from attnaudit.errors import (
    AttnauditError,
    CaptureError,
    EditError,
    NoAttentionFound,
    SiteNotFound,
    TargetError,
)
from attnaudit.record import AttentionCall, AttentionRecord, Site
from attnaudit.targets import Batch, Expectation, Seq2SeqTarget, from_hf, load_target

__version__ = "0.1.0"
_LAZY = ("audit", "Audit", "show")  # imported on first use: see __getattr__

__all__ = [
    "AttentionCall",
    "AttentionRecord",
    "AttnauditError",
    "Audit",
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
    "align",
    "audit",
    "beam_path",
    "beam_records",
    "capture",
    "from_hf",
    "load_target",
    "show",
    "tap",
]


_LAZY = ("audit", "Audit", "show", "align")


def __getattr__(name: str) -> Any:
    # audit, Audit, show and align bring in the interventions, report and plotting libraries
    # (the extras of attnaudit[all]); they are imported on first use so that ``import attnaudit``
    # (capture) stays light and works without them.
    if name not in _LAZY:
        raise AttributeError(f"module 'attnaudit' has no attribute {name!r}")
    try:
        from attnaudit.alignments.run import align
        from attnaudit.auditing.orchestration import audit
        from attnaudit.auditing.result import Audit
        from attnaudit.report.capture_view import show
    except ModuleNotFoundError as exc:
        from attnaudit.cli.extras import missing_extra

        message = missing_extra(exc, f"attnaudit.{name}")
        if message is None:
            raise
        raise ModuleNotFoundError(message, name=exc.name) from None
    return {"audit": audit, "Audit": Audit, "show": show, "align": align}[name]


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
