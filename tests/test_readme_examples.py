"""The README's Python examples run as written (the README stays true)."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def _block_after(heading: str) -> str:
    """The first ```python block after ``heading``."""
    start = README.index(heading)
    match = re.search(r"```python\n(.*?)```", README[start:], flags=re.S)
    assert match, f"no python block after {heading!r}"
    return match.group(1)


@pytest.mark.parametrize(
    "heading",
    ["## Quick start (Python)", "## How to add a solver, a backward mode or a decomposition"],
)
def test_readme_block_runs(heading: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import implicit_ham as ih

    registries = [ih.SOLVERS, ih.ADJOINTS, ih.LINEAR_SOLVERS]
    for registry in registries:
        monkeypatch.setattr(registry, "_entries", dict(registry._entries))
    code = _block_after(heading)
    if "register_solver" in code:
        code += "\nimport torch\nx = torch.randn(2, 3, requires_grad=True)\n"
        code += (
            "sol = ih.fixed_point(lambda z, x: torch.tanh(0.5 * z + x), torch.zeros(2, 3), x,"
            " solver='damped_restart', adjoint='implicit')\nsol.value.sum().backward()\n"
            "assert x.grad is not None and sol.stats.steps == 20\n"
        )
    module = types.ModuleType("readme_example")
    monkeypatch.setitem(sys.modules, "readme_example", module)
    exec(compile(code, heading, "exec"), module.__dict__)
