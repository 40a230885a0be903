"""The README's notebook example runs as written (from the repository root), and so do the
lines that show what its result holds.

nbconvert is not a dependency: the example's code blocks are executed as a notebook would
run them (``exec``), and the notebook's rich view is what Jupyter displays, the result's
``_repr_html_()``."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from attnaudit.report.explorer import DEFAULT_EXAMPLES
from tests.helpers.report_page import page_data

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
    shown = audit._repr_html_()
    assert "Valid weighted retrieval computation?" in shown
    # the attention explorer, inline: a self-contained page in an iframe's srcdoc
    (srcdoc,) = re.findall(r'<iframe class="attnaudit-explorer"[^>]*srcdoc="([^"]*)"', shown)
    data = page_data(html.unescape(srcdoc))
    assert [e["index"] for e in data["examples"]] == list(range(DEFAULT_EXAMPLES))
    assert [v["name"] for v in data["examples"][0]["views"]] == [
        "encoder_self", "decoder_self", "cross"]
    monkeypatch.chdir(tmp_path)
    exec(compile(views, "README.md", "exec"), namespace)
    assert (tmp_path / "audit" / "index.html").is_file()
