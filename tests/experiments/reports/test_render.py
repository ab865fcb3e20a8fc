"""The reports' renderer: the library's one markdown-table writer, the templates' filters, and
no hand-built markdown table left in the experiments' code."""

from __future__ import annotations

import re
from pathlib import Path

import jinja2
import pytest

from experiments.reports.render import Table, fixed, paragraph, render_beside, setting
from experiments.studies.legend_seg import ridge
from implicit_ham.diagnostics.table import markdown_table

ROOT = Path(__file__).resolve().parents[3]


def test_markdown_table_writes_header_rule_and_formatted_cells() -> None:
    rows: list[list[object]] = [[1, 0.123456, None, True], ["x", 1e-8, 2.5, False]]
    text = markdown_table(["a", "b", "c", "d"], rows, missing="–")
    assert text.splitlines() == [
        "| a | b | c | d |",
        "|---|---|---|---|",
        "| 1 | 0.1235 | – | yes |",
        "| x | 1e-08 | 2.5 | no |",
    ]
    assert markdown_table(["a"], [[None]]).splitlines()[-1] == "|  |"  # default: blank


def test_markdown_table_refuses_a_row_of_the_wrong_length() -> None:
    with pytest.raises(ValueError, match="row 1 has 1 cells for 2 columns"):
        markdown_table(["a", "b"], [[1, 2], [3]])


def test_table_values_render_through_the_writer_and_are_immutable() -> None:
    table = Table.of(["ham", "n"], [["nmf", None], ["vq", 3]])
    assert table.rows == (("nmf", None), ("vq", 3))
    assert table.markdown() == "| ham | n |\n|---|---|\n| nmf | – |\n| vq | 3 |"
    assert not Table.of(["ham"], [])


def test_filters_write_settings_numbers_and_paragraphs() -> None:
    assert [setting(v) for v in (None, 1e-05, 0.003, 1.0, 12, "warn")] == [
        "?", "1e-5", "0.003", "1.0", "12", "warn"
    ]  # fmt: skip
    assert setting(1.0, "g") == "1" and setting(None, "g") == "?"
    assert fixed(0.12345) == "0.123" and fixed(0.5, 1, sign=True) == "+0.5" and fixed(None) == "–"
    assert paragraph("  one\n two \n\nthree ") == "one two three\n"


def test_templates_fail_on_an_unknown_field() -> None:
    """StrictUndefined: a misspelt field is an error, not an empty string in the document."""
    with pytest.raises(jinja2.UndefinedError, match="has no attribute 'ran'"):
        render_beside(ridge.__file__, "study/ridge_section.md.j2", s=Table.of([], []))


def test_no_markdown_table_is_built_by_hand_in_the_experiments() -> None:
    """Every markdown table of the experiments goes through ``markdown_table`` (via ``Table``):
    no Python file writes a ``|---|`` rule or a ``"| " + " | ".join(...)`` row."""
    hand_made = re.compile(r"""---\||["']\| ["']\s*\+\s*["'] \| ["']\.join""")
    offenders = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "experiments").rglob("*.py"))
        if hand_made.search(path.read_text())
    ]
    assert offenders == []
