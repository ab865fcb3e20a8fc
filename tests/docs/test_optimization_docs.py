"""The python blocks of ``docs/optimization_layers.md`` run as written, in order, in one
namespace (the page stays true), and print what the page says they print."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "optimization_layers.md"


def test_the_optimization_layers_page_runs_and_prints_what_it_shows() -> None:
    text = PAGE.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 3
    namespace: dict[str, object] = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for i, block in enumerate(blocks):
            exec(compile(block, f"docs/optimization_layers.md[{i}]", "exec"), namespace)
    printed = out.getvalue()
    for line in printed.splitlines()[:4]:
        assert line in text, f"the page does not show the printed line {line!r}"
    assert "Hessian is not positive definite" in printed
