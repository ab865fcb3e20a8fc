"""Plain result rows (a list of dicts) that print as an aligned text table, and the markdown
table writer the experiments' reports use (one cell format for both)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Row = dict[str, Any]


class Rows(list[Row]):
    """A list of plain dicts (one per result) whose ``str`` is an aligned table.

    It is an ordinary list: ``json.dumps``, ``Sink.log_table`` and pandas accept it as is.
    """

    def __str__(self) -> str:
        return format_table(self)


def columns_of(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The union of the rows' keys, in order of first appearance."""
    seen: dict[str, None] = {}
    for row in rows:
        seen.update(dict.fromkeys(row))
    return list(seen)


def format_value(value: Any) -> str:
    """A compact cell: 4 significant digits for floats, yes/no for booleans, '' for None."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        return f"{value:.4g}"
    return str(value)


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Render rows as a text table (header, rule, one line per row); missing cells are blank."""
    cols = list(columns) if columns is not None else columns_of(rows)
    cells = [[format_value(row.get(c)) for c in cols] for row in rows]
    widths = [max([len(c), *(len(line[i]) for line in cells)]) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)) for line in cells]
    return "\n".join(line.rstrip() for line in lines)


def markdown_table(
    header: Sequence[str], body: Iterable[Sequence[Any]], missing: str = ""
) -> str:
    """Render a markdown (GitHub) table: the header, a ``|---|`` rule, one line per row of
    ``body``; cells as ``format_value`` writes them, None as ``missing``.

    Cells are written as they are: a ``|`` inside a cell is the caller's to escape.

    Raises:
        ValueError: a row whose length differs from the header's.
    """
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for index, cells in enumerate(body):
        if len(cells) != len(header):
            raise ValueError(
                f"row {index} has {len(cells)} cells for {len(header)} columns "
                f"({list(header)}); give one cell per column (None for a blank)"
            )
        text = (missing if value is None else format_value(value) for value in cells)
        lines.append("| " + " | ".join(text) + " |")
    return "\n".join(lines)
