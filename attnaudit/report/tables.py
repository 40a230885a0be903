"""Report tables: every table shown in the report is written whole as ``DIR/<name>.csv``.

The HTML shows the first rows of each table (formatted); the CSV holds all of them,
unformatted, so that the numbers can be reloaded with ``pandas.read_csv``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from attnaudit.errors import ReportError

SHOWN_ROWS = 25
_UNSAFE = re.compile(r"[^a-z0-9_]+")


def csv_name(name: str) -> str:
    """A file-system safe CSV name for a table name (``"perm by bin"`` -> ``perm_by_bin.csv``)."""
    stem = _UNSAFE.sub("_", name.lower()).strip("_")
    if not stem:
        raise ReportError(f"table name {name!r} has no usable characters")
    return f"{stem}.csv"


@dataclass(frozen=True)
class TableView:
    """A table as the HTML shows it: header, the first rows as text, and its CSV file."""

    name: str
    title: str
    caption: str
    csv: str
    columns: list[str]
    rows: list[list[str]]
    n_rows: int


def format_cell(value: object) -> str:
    """Numbers to 4 significant digits, missing values as an empty cell, the rest as text."""
    if value is None or value is pd.NA or value is pd.NaT:
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        if value.is_integer() and abs(value) < 1e12:
            return str(int(value))
        return f"{value:.4g}"
    return str(value)


def view(name: str, title: str, caption: str, frame: pd.DataFrame,
         shown: int = SHOWN_ROWS) -> TableView:
    """The HTML view of ``frame``: its first ``shown`` rows."""
    head = frame.head(shown)
    rows = [[format_cell(v) for v in row] for row in head.itertuples(index=False)]
    return TableView(name, title, caption, csv_name(name), [str(c) for c in frame.columns],
                     rows, len(frame))


def write_csvs(tables: Mapping[str, pd.DataFrame], out_dir: Path) -> dict[str, Path]:
    """Write each table to ``out_dir/<csv_name>``; two names mapping to one file is an error."""
    written: dict[str, Path] = {}
    seen: dict[str, str] = {}
    for name, frame in tables.items():
        file = csv_name(name)
        if file in seen:
            raise ReportError(f"tables {seen[file]!r} and {name!r} would both be written to {file}")
        seen[file] = name
        path = out_dir / file
        frame.to_csv(path, index=False)
        written[name] = path
    return written


def table_schema(tables: Mapping[str, pd.DataFrame]) -> dict[str, dict[str, str]]:
    """Each table's column types (pandas dtype names), as the manifest records them."""
    return {name: {str(c): str(t) for c, t in frame.dtypes.items()}
            for name, frame in tables.items()}


def read_csvs(out_dir: Path, schema: Mapping[str, Mapping[str, str]] | None
              ) -> dict[str, pd.DataFrame]:
    """The tables :func:`write_csvs` wrote to ``out_dir``, by name.

    With the ``schema`` of :func:`table_schema`, exactly the tables it lists, each column
    cast back to its recorded type (text columns keep empty cells as empty strings; mixed
    ``object`` columns, such as flags that are missing on some rows, are read back as
    pandas reads them: True, False and NaN); without one (a report written before schemas
    were recorded), every ``*.csv`` with the types pandas infers.
    """
    if schema is None:
        return {path.stem: pd.read_csv(path) for path in sorted(out_dir.glob("*.csv"))}
    tables = {}
    for name, columns in schema.items():
        path = out_dir / csv_name(name)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: the manifest lists table {name!r}")
        text = [c for c, dtype in columns.items() if dtype in ("str", "string")]
        frame = pd.read_csv(path, dtype=dict.fromkeys(text, str), keep_default_na=False,
                            na_values={c: [""] for c in columns if c not in text})
        tables[name] = frame.astype({c: dtype for c, dtype in columns.items()
                                     if c not in text and dtype != "object"})
    return tables
