"""attnaudit: audit the attention of sequence-to-sequence models.

Capture attention weights from an unmodified model, replace them inside the forward pass,
and test what they do and do not explain. The top level holds capture, the audit target,
:func:`audit`, :func:`intervene`, their options :class:`AuditOptions` and the result
:class:`Audit`; the rest lives in one subpackage per layer
(docs/architecture.md): ``capturing``, ``targets``, ``analysis`` (streaming analysers),
``runtime`` (processes, progress, output folders), ``interventions`` (weight and value
edits), ``validity`` (the validity pipeline, findings and the CI gate), ``attribution``
(Captum methods, leave-one-out, agreement), ``checklist``, ``alignments`` (word
alignments and their error rate), ``report`` (HTML/CSV),
``auditing`` (the orchestration) and ``cli``; ``attnaudit.testing`` is a pytest helper;
``attnaudit.options`` the settings.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers and editors see; at run time, __getattr__
    from attnaudit.alignments.run import align
    from attnaudit.auditing.orchestration import audit, intervene, plan
    from attnaudit.auditing.result import Audit
    from attnaudit.capturing import (
        Capture,
        Edit,
        ModelFacts,
        beam_path,
        beam_records,
        capture,
        register_model_facts,
        tap,
        unregister_model_facts,
    )
    from attnaudit.errors import (
        AttnauditError,
        CaptureError,
        EditError,
        NoAttentionFound,
        SiteNotFound,
        TargetError,
    )
    from attnaudit.options import AuditMode, AuditOptions
    from attnaudit.record import AttentionCall, AttentionRecord, Family, Role, Site
    from attnaudit.report.capture_view import show
    from attnaudit.targets import (
        AuditTarget,
        Batch,
        DecoderOnlyTarget,
        Expectation,
        Seq2SeqTarget,
        from_hf,
        load_target,
    )

__version__ = "0.1.0"

# Each public name and the module that defines it. Every name is imported on first use
# (see __getattr__): ``import attnaudit`` itself imports nothing, so that the command line
# answers --help without torch, and capture works without the extras of attnaudit[all]
# that audit, Audit, show and align need.
_WHERE = {
    "AttentionCall": "attnaudit.record",
    "AttentionRecord": "attnaudit.record",
    "Site": "attnaudit.record",
    "Family": "attnaudit.record",
    "Role": "attnaudit.record",
    "AttnauditError": "attnaudit.errors",
    "CaptureError": "attnaudit.errors",
    "EditError": "attnaudit.errors",
    "NoAttentionFound": "attnaudit.errors",
    "SiteNotFound": "attnaudit.errors",
    "TargetError": "attnaudit.errors",
    "AuditMode": "attnaudit.options",
    "AuditOptions": "attnaudit.options",
    "Capture": "attnaudit.capturing",
    "Edit": "attnaudit.capturing",
    "beam_path": "attnaudit.capturing",
    "beam_records": "attnaudit.capturing",
    "capture": "attnaudit.capturing",
    "tap": "attnaudit.capturing",
    "ModelFacts": "attnaudit.capturing",
    "register_model_facts": "attnaudit.capturing",
    "unregister_model_facts": "attnaudit.capturing",
    "Batch": "attnaudit.targets",
    "Expectation": "attnaudit.targets",
    "Seq2SeqTarget": "attnaudit.targets",
    "AuditTarget": "attnaudit.targets",
    "DecoderOnlyTarget": "attnaudit.targets",
    "from_hf": "attnaudit.targets",
    "load_target": "attnaudit.targets",
    "align": "attnaudit.alignments.run",
    "audit": "attnaudit.auditing.orchestration",
    "intervene": "attnaudit.auditing.orchestration",
    "plan": "attnaudit.auditing.orchestration",
    "Audit": "attnaudit.auditing.result",
    "show": "attnaudit.report.capture_view",
}

__all__ = [
    "AttentionCall",
    "AttentionRecord",
    "AttnauditError",
    "Audit",
    "AuditMode",
    "AuditOptions",
    "AuditTarget",
    "Batch",
    "Capture",
    "CaptureError",
    "DecoderOnlyTarget",
    "Edit",
    "EditError",
    "Expectation",
    "Family",
    "ModelFacts",
    "NoAttentionFound",
    "Role",
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
    "intervene",
    "load_target",
    "plan",
    "register_model_facts",
    "show",
    "tap",
    "unregister_model_facts",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        # A subpackage, as ``import attnaudit`` used to load capturing and targets eagerly.
        try:
            return import_module(f"attnaudit.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"attnaudit.{name}":
                raise
        raise AttributeError(f"module 'attnaudit' has no attribute {name!r}")
    try:
        value = getattr(import_module(_WHERE[name]), name)
    except ModuleNotFoundError as exc:
        from attnaudit.cli.extras import missing_extra

        message = missing_extra(exc, f"attnaudit.{name}")
        if message is None:
            raise
        raise ModuleNotFoundError(message, name=exc.name) from None
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
