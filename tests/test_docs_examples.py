"""The Python code blocks of the README and of the docs pages run as written (the docs stay
true). The blocks of one file run in order in one fresh process (a later block may use the
names of an earlier one; plug-in registrations do not leak into the test session). A block that
is illustrative only is preceded by the line ``<!-- docs-test: skip -->``; keep such skips rare.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
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


def script(path: Path, blocks: list[tuple[int, str]]) -> str:
    """A program that runs the blocks in one namespace, each compiled with its page position."""
    lines = ["namespace = {'__name__': '__main__'}"]
    for line, code in blocks:
        padded = "\n" * (line - 1) + code  # tracebacks point at the page's own line numbers
        lines.append(f"exec(compile({padded!r}, {str(path)!r}, 'exec'), namespace)")
    return "\n".join(lines)


def test_the_block_finder_skips_marked_blocks_only() -> None:
    text = f"a\n```python\nx = 1\n```\n{SKIP}\n```python\ny = 2\n```\n```bash\nls\n```\n"
    assert python_blocks(text) == [(3, "x = 1\n")]


@pytest.mark.parametrize(
    "path",
    [p for p in PAGES if python_blocks(p.read_text())],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_page_code_blocks_run(path: Path, tmp_path: Path) -> None:
    program = script(path, python_blocks(path.read_text()))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # `experiments` importable, files go to tmp
    run = subprocess.run(
        [sys.executable, "-c", program],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-4000:]
