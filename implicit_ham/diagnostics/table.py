"""Plain result rows (a list of dicts) that print as an aligned text table."""

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
