"""The curated public API, and that it imports without the optional extras."""

from __future__ import annotations

import importlib
import subprocess
import sys

import attnaudit

# Each public name and the module that defines it.
PUBLIC = {
    "attnaudit.record": ("AttentionCall", "AttentionRecord", "Family", "Role", "Site"),
    "attnaudit.errors": ("AttnauditError", "CaptureError", "EditError", "NoAttentionFound",
                         "SiteNotFound", "TargetError"),
    "attnaudit.capturing.recorder": ("Capture", "Edit", "capture"),
    "attnaudit.capturing.tap": ("tap",),
    "attnaudit.capturing.beams": ("beam_path", "beam_records"),
    "attnaudit.capturing.model_facts": ("ModelFacts", "register_model_facts",
                                        "unregister_model_facts"),
    "attnaudit.options": ("AuditMode", "AuditOptions"),
    "attnaudit.auditing.orchestration": ("audit", "intervene", "plan"),
    "attnaudit.alignments.run": ("align",),
    "attnaudit.auditing.result": ("Audit",),
    "attnaudit.report.capture_view": ("show",),
    "attnaudit.targets.contract": ("AuditTarget", "Batch", "DecoderOnlyTarget", "Expectation",
                                   "Seq2SeqTarget"),
    "attnaudit.targets.hf.loading": ("from_hf",),
    "attnaudit.targets.loading": ("load_target",),
}


def test_exported_names_are_exactly_the_curated_api():
    names = {name for group in PUBLIC.values() for name in group}
    assert set(attnaudit.__all__) == names
    for module, group in PUBLIC.items():
        defined = importlib.import_module(module)
        for name in group:
            assert getattr(attnaudit, name) is vars(defined)[name], name


def test_import_works_without_transformers():
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "import attnaudit, torch\n"
        "assert 'transformers' not in sys.modules or sys.modules['transformers'] is None\n"
        "m = torch.nn.MultiheadAttention(4, 1)\n"
        "with attnaudit.capture(m) as cap:\n"
        "    m(torch.randn(2, 1, 4), torch.randn(2, 1, 4), torch.randn(2, 1, 4))\n"
        "print(cap.sites)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert "forward" in result.stdout
