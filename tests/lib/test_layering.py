"""The library's layers point down (docs/architecture.md): every module's imports, read with
``ast``, go only to its own layer or the layers below it, never to ``experiments``, and the
imports between modules form no cycle. Also: ``import implicit_ham`` stays light (no
``torch._dynamo``, no torchdeq, no training or plotting stack)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "implicit_ham"

# rank of each sub-package; a module may import from its own sub-package and lower ranks only
RANKS = {
    "_core": 0,
    "linalg": 1,
    "solvers": 2,
    "adjoints": 3,
    "problems": 4,
    "decompositions": 5,
    "nn": 6,
    "diagnostics": 7,
    "reliability": 7,
    "testing": 8,
}
NAMESPACES = {"__init__", "plugins", "errors"}  # the top-level namespaces: above every layer


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> str:
    """The sub-package (or top-level namespace) a dotted module name belongs to."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in NAMESPACES:
        return "namespace"
    return parts[1]


def rank_of(layer: str) -> int:
    return len(RANKS) + 1 if layer == "namespace" else RANKS[layer]


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in ast.walk(node):
                if hasattr(child, "lineno"):
                    lines.add(child.lineno)
    return lines


def imports_of(module: str) -> list[tuple[str, int]]:
    """(imported module, line) for every runtime import of ``module`` (module level and inside
    functions; ``if TYPE_CHECKING:`` blocks excluded). ``from pkg import sub`` names the
    submodule when ``sub`` is one."""
    tree = ast.parse(MODULES[module].read_text())
    skip = _type_checking_lines(tree)
    out = []
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0, f"{module}:{node.lineno}: relative import"
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.append((sub if sub in MODULES else node.module, node.lineno))
    return out


def test_every_subpackage_has_a_rank() -> None:
    layers = {layer_of(m) for m in MODULES}
    assert layers - {"namespace"} == set(RANKS), "give each new sub-package a rank in RANKS"


def test_imports_point_down_and_never_to_experiments() -> None:
    wrong = []
    for module in MODULES:
        own = layer_of(module)
        for target, line in imports_of(module):
            where = f"{MODULES[module].relative_to(PACKAGE.parent)}:{line}"
            if target.split(".")[0] == "experiments":
                wrong.append(f"{where} imports {target} (the library never imports experiments)")
                continue
            if target.split(".")[0] != "implicit_ham":
                continue
            theirs = layer_of(target)
            if theirs == own:
                continue
            if rank_of(theirs) >= rank_of(own):
                wrong.append(f"{where}: {own} imports {target} (layer {theirs}, not below it)")
    assert not wrong, "\n".join(wrong)


def test_core_imports_nothing_else_of_the_library() -> None:
    for module in (m for m in MODULES if layer_of(m) == "_core"):
        for target, line in imports_of(module):
            assert not target.startswith("implicit_ham.") or layer_of(target) == "_core", (
                f"{module}:{line} imports {target}"
            )


def test_no_import_cycles() -> None:
    graph = {
        m: {t for t, _ in imports_of(m) if t in MODULES and t != m} for m in MODULES
    }
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = [*stack[stack.index(nxt):], nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for m in sorted(MODULES):
        if m not in state:
            visit(m)


def _private_library_imports(path: Path) -> list[str]:
    """``module:line`` of every import of ``implicit_ham._*`` in one file (module level and in
    functions; ``from implicit_ham import _core`` too)."""
    found: list[int] = []
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        if any(n.startswith("implicit_ham._") for n in names):
            found.append(node.lineno)
    return [f"{path.name}:{line}" for line in sorted(found)]


def test_private_import_finder_sees_every_form(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text(
        "import implicit_ham.plugins\nfrom implicit_ham._core.state import StateSpec\n"
        "def f():\n    import implicit_ham._core.sinks\nfrom implicit_ham import _core\n"
    )
    assert _private_library_imports(path) == ["m.py:2", "m.py:4", "m.py:5"]


def test_experiments_use_only_the_public_library() -> None:
    """experiments/ reaches the library through its public namespaces, never ``implicit_ham._*``
    (what it needs is exported: validation helpers and registries in ``implicit_ham.plugins``,
    sinks in ``implicit_ham.diagnostics``, errors in ``implicit_ham.errors``)."""
    experiments = PACKAGE.parent / "experiments"
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{where.split(':')[1]}"
        for path in sorted(experiments.rglob("*.py"))
        for where in _private_library_imports(path)
    ]
    assert offenders == [], f"imports of the library's private modules: {offenders}"


def test_import_is_light() -> None:
    code = (
        "import sys, time, json; t0 = time.perf_counter(); import torch; "
        "t1 = time.perf_counter(); import implicit_ham; t2 = time.perf_counter(); "
        "heavy = ['torch._dynamo', 'torchdeq', 'hydra', 'omegaconf', 'wandb', 'matplotlib', "
        "'rich', 'experiments', 'implicit_ham.testing']; "
        "print(json.dumps({'loaded': [m for m in heavy if m in sys.modules], "
        "'torch_s': t1 - t0, 'ih_s': t2 - t1}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["loaded"] == [], result  # (the import time is measured, not bounded here)
