"""The Python code blocks of the README and of the docs pages run as written (the docs stay
true). The blocks of one file run in order in one namespace (a later block may use the names of
an earlier one), in a temporary working directory, with the registries restored afterwards (a
page's plug-ins do not leak into other tests). A block that is illustrative only is preceded by
the line ``<!-- docs-test: skip -->``; keep such skips rare.
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

import implicit_ham as ih

ROOT = Path(__file__).resolve().parents[2]
SKIP = "<!-- docs-test: skip -->"
FENCE = re.compile(r"^```python\n(.*?)^```", flags=re.S | re.M)
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(first line number, code) of every ```python block not preceded by the skip marker."""
    blocks = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        if before.strip() != SKIP:
            blocks.append((text.count("\n", 0, match.start()) + 2, match.group(1)))
    return blocks


def test_the_block_finder_skips_marked_blocks_only() -> None:
    text = f"a\n```python\nx = 1\n```\n{SKIP}\n```python\ny = 2\n```\n```bash\nls\n```\n"
    assert python_blocks(text) == [(3, "x = 1\n")]


@pytest.mark.parametrize(
    "path",
    [p for p in PAGES if python_blocks(p.read_text())],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_page_code_blocks_run(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for registry in (
        ih.plugins.SOLVERS,
        ih.plugins.ADJOINTS,
        ih.plugins.LINEAR_SOLVERS,
        ih.plugins.DECOMPOSITIONS,
    ):
        builtins = {  # as in a fresh process: no plug-ins of other test modules
            name: cls
            for name, cls in registry._entries.items()
            if cls.__module__.startswith("implicit_ham.")
        }
        monkeypatch.setattr(registry, "_entries", builtins)
    monkeypatch.chdir(tmp_path)
    page = types.ModuleType(f"docs_{path.stem.replace('-', '_')}")  # dataclasses look it up
    monkeypatch.setitem(sys.modules, page.__name__, page)
    for line, code in python_blocks(path.read_text()):
        padded = "\n" * (line - 1) + code  # tracebacks point at the page's own line numbers
        exec(compile(padded, str(path), "exec"), page.__dict__)
