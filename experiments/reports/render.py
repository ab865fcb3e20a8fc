"""Render the experiments' markdown documents from the Jinja2 templates in ``templates/``.

Every report (the study's ``docs/results.md``, ``docs/generation.md``, the benchmark pages, a
sweep's ``report.md``) is a template filled by frozen dataclasses computed from the run outputs:
the templates hold the prose, the dataclasses every number, setting and verdict. Tables are
``Table`` values, written by the library's one markdown-table writer
(``implicit_ham.diagnostics.table.markdown_table``).

Filters the templates use: ``table`` (a ``Table`` as markdown), ``paragraph`` (a block of wrapped
template lines as one line, so long sentences can be written over several template lines),
``setting`` (a configured value as the document writes it, ``?`` when the run did not record it),
``names`` (upper-cased names joined by commas), ``fixed`` (a number to a fixed count of decimals,
``MISSING_CELL`` for None).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from implicit_ham.diagnostics.table import markdown_table

TEMPLATES = Path(__file__).parent / "templates"
MISSING_CELL = "–"  # a table cell without a value
UNKNOWN_SETTING = "?"  # a setting the run's config does not record


@dataclass(frozen=True)
class Table:
    """A markdown table as data: the header and the rows of cells (None: no value, shown as
    ``MISSING_CELL``; floats to 4 significant digits, as ``format_value`` writes them)."""

    header: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]

    @classmethod
    def of(cls, header: Iterable[str], rows: Iterable[Iterable[Any]]) -> Table:
        """A table from any iterables (stored as tuples, so the value is immutable)."""
        return cls(tuple(header), tuple(tuple(row) for row in rows))

    def __bool__(self) -> bool:
        return bool(self.rows)

    def markdown(self) -> str:
        """The table as markdown lines (no trailing newline)."""
        return markdown_table(self.header, self.rows, missing=MISSING_CELL)


def setting(value: Any, spec: str = "") -> str:
    """A configured value as prose writes it: ``?`` for None; with a format ``spec``
    (``"g"``: ``1.0`` -> ``1``) as ``format`` writes it; else as ``str`` with the exponent of a
    float compacted (``1e-05`` -> ``1e-5``)."""
    if value is None:
        return UNKNOWN_SETTING
    if spec:
        return format(value, spec)
    if isinstance(value, float):
        return re.sub(r"e([+-])0*(\d)", lambda m: f"e{m[1].strip('+')}{m[2]}", str(value))
    return str(value)


def paragraph(text: str) -> str:
    """The lines of ``text`` joined by single spaces, with one trailing newline: a paragraph
    written over several template lines renders as one line."""
    return " ".join(line.strip() for line in text.strip().splitlines() if line.strip()) + "\n"


def fixed(value: float | None, digits: int = 3, sign: bool = False) -> str:
    """``value`` with ``digits`` decimals (a ``+`` before positive values with ``sign``), or
    ``MISSING_CELL`` for None."""
    if value is None:
        return MISSING_CELL
    return f"{value:{'+' if sign else ''}.{digits}f}"


def names(items: Sequence[str]) -> str:
    """``["nmf", "vq"]`` -> ``"NMF, VQ"``."""
    return ", ".join(item.upper() for item in items)


@functools.cache
def environment() -> jinja2.Environment:
    """The templates' environment: undefined names are errors, block tags leave no blank
    lines, markdown is not HTML-escaped."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters.update(
        table=lambda t: t.markdown(),
        paragraph=paragraph,
        setting=setting,
        names=names,
        fixed=fixed,
    )
    return env


def render(template: str, **data: Any) -> str:
    """The document ``template`` (a path under ``templates/``) filled with ``data``."""
    return environment().get_template(template).render(**data)


@functools.cache
def environment_beside(folder: Path) -> jinja2.Environment:
    """``environment()`` that finds a template in ``folder`` or ``folder/templates`` first (a
    study's or benchmark's own templates beside its code), then under ``templates/``."""
    base = environment()
    assert base.loader is not None
    own = jinja2.FileSystemLoader([str(folder), str(folder / "templates")])
    loader = jinja2.ChoiceLoader([own, base.loader])
    return base.overlay(loader=loader)


def render_beside(module_file: str, template: str, **data: Any) -> str:
    """The template ``template`` beside the module ``module_file`` (pass ``__file__``; or in the
    ``templates`` folder beside it) filled with ``data``."""
    return environment_beside(Path(module_file).parent).get_template(template).render(**data)


def replace_between(text: str, block: str, begin: str, end: str, where: object = "the page") -> str:
    """``text`` with its part from ``begin`` to ``end`` (both included) replaced by ``block``:
    a page's generated part, the hand-written rest as it is. ValueError naming ``where`` and the
    markers when ``text`` lacks either."""
    if begin not in text or end not in text:
        raise ValueError(f"{where} lacks the marker lines {begin!r} and {end!r}; add them")
    head, rest = text.split(begin, 1)
    return head + block + rest.split(end, 1)[1]


def splice(path: Path, content: str, begin: str, end: str, top: bool = False) -> None:
    """Put ``content`` between the markers ``begin`` / ``end`` in ``path`` (a generated block of
    a page whose other parts another command writes); a file without them gets the marked
    block appended (``top``: inserted after the file's first line), a missing file is
    created."""
    block = content if content.startswith(begin) else f"{begin}\n{content.strip()}\n{end}"
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    elif top and text.strip():
        first, _, rest = text.partition("\n")
        text = f"{first}\n\n{block}\n\n{rest.lstrip()}"
    else:
        text = (text.rstrip() + "\n\n" if text.strip() else "") + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
