"""Reading a written report back: its checklist sections, verdicts, tables and images."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path


@dataclass
class PageTable:
    csv: str
    header: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)


class ReportPage(HTMLParser):
    """Sections (data-item -> data-status), verdicts, tables with their cells, images."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: dict[str, str] = {}
        self.verdicts: dict[str, str] = {}
        self.tables: list[PageTable] = []
        self.images: list[dict[str, str]] = []
        self.scripts = 0
        self.inline_scripts = 0  # scripts without a src: nothing loaded from elsewhere
        self._cell: list[str] | None = None
        self._row: list[str] | None = None
        self._in_head = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "script":
            self.scripts += 1
            self.inline_scripts += "src" not in a
        if tag == "section" and "data-item" in a:
            self.sections[a["data-item"]] = a["data-status"]
        if tag == "div" and a.get("id", "").startswith("verdict-"):
            self.verdicts[a["id"]] = a["data-status"]
        if tag == "table" and "data-csv" in a:
            self.tables.append(PageTable(a["data-csv"]))
        if tag == "img":
            self.images.append(a)
        if self.tables and tag == "thead":
            self._in_head = True
        if self.tables and tag == "tr":
            self._row = []
        if self._row is not None and tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell))
            self._cell = None
        elif tag == "tr" and self._row is not None and self.tables:
            table = self.tables[-1]
            if self._in_head:
                table.header = self._row
            else:
                table.rows.append(self._row)
            self._row = None
        elif tag == "thead":
            self._in_head = False
        elif tag == "table":
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def read_page(path: Path) -> ReportPage:
    page = ReportPage()
    page.feed(path.read_text(encoding="utf-8"))
    return page


EXPLORER_DATA = re.compile(r'<script type="application/json" class="ax-data">(.*?)</script>',
                           re.S)


def page_data(html: str) -> dict:
    """The attention explorer's JSON as a page holds it (exactly one explorer)."""
    found = EXPLORER_DATA.findall(html)
    assert len(found) == 1, len(found)
    return json.loads(found[0])
