"""The attention explorer as HTML: the block the report's page includes, a standalone page
and its notebook form (an ``<iframe srcdoc>``: no server, no widget extension).

The script and style are package data (``attnaudit/report/static/``: ``explorer-data.js``
decodes the payload and formats numbers, ``explorer-draw.js`` draws, ``explorer.js`` is
the interface), inlined into the page: it makes no network request and works from a file.
The payload (:func:`attnaudit.report.explorer.payload`) is inlined as JSON.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from markupsafe import Markup

SCRIPTS = ("explorer-data.js", "explorer-draw.js", "explorer.js")
STYLE = "explorer.css"
NOTEBOOK_HEIGHT = 720  # pixels of the notebook's iframe; the explorer scrolls inside it


@cache
def asset(name: str) -> str:
    """The text of one of the explorer's files in ``attnaudit/report/static``."""
    return resources.files("attnaudit.report").joinpath("static", name).read_text("utf-8")


def _json(data: Any) -> str:
    """JSON safe inside a ``<script>`` element: ``<``, ``>`` and ``&`` as escapes, so no
    token text can close the element."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _script(text: str) -> str:
    if "</script" in text.lower():
        raise ValueError("an explorer script holds '</script' and cannot be inlined")
    return text


def explorer_block(data: dict[str, Any], *, heading: str = "Attention explorer") -> Markup:
    """The explorer's element with its data, style and script inline (the report's page
    includes it once)."""
    scripts = "\n".join(f"<script>\n{_script(asset(name))}\n</script>" for name in SCRIPTS)
    return Markup(
        f'<style>\n{asset(STYLE)}\n</style>\n'
        f'<div class="ax-explorer" role="region" aria-label="{html.escape(heading)}">\n'
        f'<script type="application/json" class="ax-data">{_json(data)}</script>\n'
        f'</div>\n{scripts}\n')


def standalone_page(data: dict[str, Any], title: str) -> str:
    """A whole HTML page holding the explorer alone."""
    return ('<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f'<title>{html.escape(title)}</title>\n'
            '<style>body { margin: 0; padding: .5rem; }</style>\n</head>\n<body>\n'
            f'<h1 style="font: 600 1rem system-ui, sans-serif">{html.escape(title)}</h1>\n'
            f'{explorer_block(data, heading=title)}</body>\n</html>\n')


@dataclass(frozen=True)
class ExplorerPage:
    """The explorer as a standalone page: shown inline in a notebook (``_repr_html_``, an
    iframe whose ``srcdoc`` is the page), or saved as one HTML file."""

    html: str
    height: int = NOTEBOOK_HEIGHT

    def _repr_html_(self) -> str:
        return iframe(self.html, self.height)

    def save(self, path: str | Path) -> Path:
        """Write the page to ``path`` (one self-contained HTML file); return the path."""
        out = Path(path)
        out.write_text(self.html, encoding="utf-8")
        return out


def iframe(page: str, height: int = NOTEBOOK_HEIGHT) -> str:
    """``page`` in an iframe's ``srcdoc`` (escaped), sized for a notebook cell."""
    return (f'<iframe class="attnaudit-explorer" title="attnaudit attention explorer" '
            f'style="width: 100%; height: {height}px; border: 0" '
            f'srcdoc="{html.escape(page, quote=True)}"></iframe>')
