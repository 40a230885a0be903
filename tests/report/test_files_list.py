"""The "Files" list at the foot of the report page names the files of its folder: every CSV
written is listed and every listed file is there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

FOOTER = re.compile(r"<footer>\s*<h2>Files</h2>(.*?)</footer>", re.S)
LINK = re.compile(r'<a href="([^"]+)">')


def listed_files(folder: Path) -> list[str]:
    """The link targets of the page's Files list."""
    page = (folder / "index.html").read_text(encoding="utf-8")
    [footer] = FOOTER.findall(page)
    return LINK.findall(footer)


@pytest.mark.parametrize("name", ["date", "date_transformer"])
def test_the_files_list_is_the_folder(cli_reports, name):
    folder = cli_reports(name)
    listed = listed_files(folder)
    on_disk = {p.name for p in folder.iterdir() if p.is_file()}
    assert len(listed) == len(set(listed)), "a file is listed twice"
    assert set(listed) <= on_disk, sorted(set(listed) - on_disk)
    csvs = {n for n in on_disk if n.endswith(".csv")}
    assert csvs <= set(listed), sorted(csvs - set(listed))
    assert set(listed) == on_disk - {"index.html"}
    # the tables outside the checklist's evidence, which an item-by-item list missed
    assert {"attention_maps.csv", "weights_vs_contributions.csv", "top_keys.csv",
            "contribution_measures.csv", "manifest.json"} <= set(listed)
