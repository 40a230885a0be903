"""MkDocs hook: the package's docstrings use Sphinx roles (:func:`x`, :class:`~a.b.C`) and
``text::`` before literal blocks; render them as Sphinx would, as plain code and a colon."""

from __future__ import annotations

import re
from typing import Any

# After Markdown, :role:`target` is ":role:<code>target</code>"; a leading ~ shows only the
# last component of the dotted path.
_ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|exc|obj):<code>(~?)([^<]*)</code>")
_LITERAL_MARKER = re.compile(r"::</p>")


def _code(match: re.Match[str]) -> str:
    short, target = match.groups()
    return f"<code>{target.rsplit('.', 1)[-1] if short else target}</code>"


def on_page_content(html: str, **_: Any) -> str:
    return _LITERAL_MARKER.sub(":</p>", _ROLE.sub(_code, html))
