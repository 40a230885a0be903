"""The README's notebook example runs as written (from the repository root), and so do the
lines that show what its result holds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Python: audit a model in a notebook"


def _blocks() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index(SECTION):]
    section = section[:section.index("\n## ", len(SECTION))]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_notebook_example_runs(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    example, views = _blocks()
    assert "attnaudit.audit(model, tokenizer=tokenizer" in example
    namespace: dict = {}
    monkeypatch.chdir(ROOT)
    exec(compile(example, "README.md", "exec"), namespace)
    audit = namespace["audit"]
    assert audit.manifest["data"]["examples"] == 10
    assert audit.verdicts["validity"] == "pass"
    assert "Valid weighted retrieval computation?" in audit._repr_html_()
    monkeypatch.chdir(tmp_path)
    exec(compile(views, "README.md", "exec"), namespace)
    assert (tmp_path / "audit" / "index.html").is_file()
