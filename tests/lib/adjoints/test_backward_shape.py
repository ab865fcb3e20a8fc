"""The implicit backward stays in small named pieces (issue 48 item 2): no function over 40
lines or 6 parameters (``self`` / ``cls`` not counted, ``*args`` / ``**kwargs`` counted) in the
modules of the backward path, and no branch on ``root_of`` there (the fixed point / root
difference lives in ``adjoint_system``'s two classes)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import implicit_ham.adjoints as adjoints

ROOT = Path(adjoints.__file__).parent
BACKWARD_PATH = (
    "implicit_backward.py",
    "second_order.py",
    "conditions.py",
    "per_sample.py",
    "adjoint_system.py",
    "backward_check.py",
)


def _oversized(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        a = node.args
        names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
        names += [p.arg for p in (a.vararg, a.kwarg) if p is not None]
        params = len([n for n in names if n not in ("self", "cls")])
        lines = (node.end_lineno or node.lineno) - node.lineno + 1
        if lines > 40 or params > 6:
            found.append(f"{path.name}:{node.lineno} {node.name}: {lines} lines, {params} params")
    return found


@pytest.mark.parametrize("name", BACKWARD_PATH)
def test_backward_path_functions_are_small(name: str) -> None:
    assert _oversized(ROOT / name) == []


def test_the_size_check_sees_a_long_function(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(41))
    path = tmp_path / "long.py"
    path.write_text(f"def f(a, b, c, d, e, f, *g):\n{body}")
    assert _oversized(path) == ["long.py:1 f: 42 lines, 7 params"]


@pytest.mark.parametrize("name", ["implicit_backward.py", "second_order.py"])
def test_no_root_of_branches_in_the_backward_pass(name: str) -> None:
    assert "root_of" not in (ROOT / name).read_text()
