"""``index.html``: the report page rendered from ``templates/report.html.j2``, written last
into its folder so that its "Files" list names the files actually there.

Autoescaping is on for every value: tokens, site names, file names and target descriptions
are user-provided and render as text. Only the template itself produces markup.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2

from attnaudit.checklist.items import Claim

PAGE = "index.html"
TEMPLATE = "report.html.j2"
SUMMARY_TEMPLATE = "summary.html.j2"


def status_class(status: str) -> str:
    """CSS class suffix for a status (``"not recorded"`` -> ``not-recorded``)."""
    return status.replace(" ", "-")


def claim_number(claim: Claim) -> str:
    """A claim's number with its interval ("0.42 [0.38, 0.47]"), "no interval" without one,
    "—" for a claim read from no single number (the headline, a not tested one)."""
    return interval_text(claim.estimate, claim.low, claim.high)


def interval_text(estimate: float, low: float, high: float) -> str:
    """See :func:`claim_number`."""
    if not math.isfinite(estimate):
        return "—"
    if not (math.isfinite(low) and math.isfinite(high)):
        return f"{estimate:.3g} (no interval)"
    return f"{estimate:.3g} [{low:.3g}, {high:.3g}]"


LEAD_CHARS = 300  # longer text shows its first sentence, the rest one click away


def split_lead(text: str, limit: int = LEAD_CHARS) -> tuple[str, str]:
    """(first sentence, the rest) of a text longer than ``limit`` characters; (text, "")
    for a shorter one or one with no sentence break before ``limit``."""
    if len(text) <= limit:
        return text, ""
    end = text.find(". ", 0, limit)
    if end < 0:
        return text, ""
    return text[:end + 1], text[end + 2:]


def claim_threshold(threshold: float) -> str:
    return "—" if not math.isfinite(threshold) else f"{threshold:.3g}"


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("attnaudit.report", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters["status_class"] = status_class
    env.filters["claim_number"] = claim_number
    env.filters["claim_threshold"] = claim_threshold
    env.filters["split_lead"] = split_lead
    return env


def render(context: Mapping[str, Any]) -> str:
    """The page for ``context`` (see :func:`attnaudit.report.write_report` for its keys)."""
    return environment().get_template(TEMPLATE).render(**context)


def render_summary(context: Mapping[str, Any]) -> str:
    """The notebook summary for ``context`` (see :func:`attnaudit.report.summary_html`)."""
    return environment().get_template(SUMMARY_TEMPLATE).render(**context)


def folder_files(out_dir: Path) -> list[str]:
    """The names of the files in ``out_dir`` but the page, sorted: the page's "Files" list."""
    return sorted(p.name for p in out_dir.iterdir() if p.is_file() and p.name != PAGE)


def write_html(context: Mapping[str, Any], out_dir: Path) -> Path:
    """Write the page into ``out_dir``, after every other file of the report (``files`` in
    the context: :func:`folder_files`); return its path."""
    path = out_dir / PAGE
    path.write_text(render({**context, "files": folder_files(out_dir)}), encoding="utf-8")
    return path
