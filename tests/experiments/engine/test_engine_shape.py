"""The training engine stays readable (issue 48, item 4): no function of
``experiments/engine`` is over 60 lines or takes over 8 parameters (``self`` / ``cls`` not
counted, ``*args`` / ``**kwargs`` counted), measured on the source with ``ast`` as
``experiments.code_stats`` measures the whole code base."""

from __future__ import annotations

import ast
from pathlib import Path

from experiments.code_stats import parameter_count

ENGINE = Path(__file__).resolve().parents[3] / "experiments" / "engine"
MAX_LINES, MAX_PARAMETERS = 60, 8


def _functions() -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    out = []
    for path in sorted(ENGINE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                out.append((f"{path.name}:{node.lineno} {node.name}", node))
    return out


def test_the_engine_is_measured() -> None:
    names = {name.split()[1] for name, _ in _functions()}
    assert {"fit", "train_epoch", "run_training", "evaluate"} <= names


def test_no_engine_function_is_over_60_lines() -> None:
    long = [
        f"{name} ({node.end_lineno - node.lineno + 1} lines)"
        for name, node in _functions()
        if node.end_lineno is not None and node.end_lineno - node.lineno + 1 > MAX_LINES
    ]
    assert not long, f"functions over {MAX_LINES} lines in experiments/engine: {long}"


def test_no_engine_function_takes_over_8_parameters() -> None:
    many = [
        f"{name} ({parameter_count(node)} parameters)"
        for name, node in _functions()
        if parameter_count(node) > MAX_PARAMETERS
    ]
    assert not many, f"functions over {MAX_PARAMETERS} parameters in experiments/engine: {many}"
