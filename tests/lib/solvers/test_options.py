"""The Anderson / Broyden options are declared and checked once (``linalg.AndersonOptions``,
``solvers.options``): every solver that has an option refuses the same bad value with the same
message, the registry names still build them, and torchdeq's solvers without torchdeq raise an
ImportError that names the extra."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest
from helpers.registry_names import torchdeq_available

import implicit_ham as ih

ANDERSON_FORWARD: list[Callable[..., Any]] = [ih.Anderson]
BROYDEN_FORWARD: list[Callable[..., Any]] = [ih.Broyden]
if torchdeq_available():
    ANDERSON_FORWARD.append(ih.solvers.TorchDEQAnderson)
    BROYDEN_FORWARD.append(ih.solvers.TorchDEQBroyden)
ANDERSON_ALL = [*ANDERSON_FORWARD, ih.linalg.AndersonSolve]


@pytest.mark.parametrize("cls", ANDERSON_ALL, ids=lambda c: c.__name__)
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"m": 1}, "m must be an integer >= 2, got 1"),
        ({"m": 2.5}, "m must be an integer >= 2"),
        ({"lam": -1e-3}, r"lam must be a finite number >= 0 \(0: no regularisation\)"),
        ({"retry_lam": float("nan")}, "retry_lam must be a finite number >= 0"),
    ],
)
def test_every_anderson_refuses_the_same_bad_mixing_options(
    cls: Callable[..., Any], options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=f"^{cls.__name__}: {message}"):
        cls(**options)


@pytest.mark.parametrize(
    ("classes", "options", "message"),
    [
        (ANDERSON_FORWARD, {"max_steps": 3}, "max_steps must be an integer >= 4"),
        (BROYDEN_FORWARD, {"max_steps": 2}, "max_steps must be an integer >= 3"),
        (ANDERSON_FORWARD + BROYDEN_FORWARD, {"tol": 0.0}, "tol must be a positive number"),
        (ANDERSON_FORWARD, {"damping": 1.5}, r"damping must lie in \(0, 1\]"),
        (ANDERSON_FORWARD + BROYDEN_FORWARD, {"stop_mode": "max"}, "stop_mode must be one of"),
    ],
)
def test_forward_options_are_checked_alike(
    classes: list[Callable[..., Any]], options: dict[str, Any], message: str
) -> None:
    for cls in classes:
        with pytest.raises(ValueError, match=f"^{cls.__name__}: {message}"):
            cls(**options)


def test_the_smallest_budgets_are_accepted() -> None:
    for cls in ANDERSON_FORWARD:
        assert cls(max_steps=4).max_steps == 4
    for cls in BROYDEN_FORWARD:
        assert cls(max_steps=3).max_steps == 3


def test_registry_names_build_the_solvers_with_their_options() -> None:
    forward = ih.plugins.make_solver("anderson", m=3, lam=0.0, retry_lam=0.5, damping=0.5)
    assert forward == ih.Anderson(m=3, lam=0.0, retry_lam=0.5, damping=0.5)
    assert forward.attempts == (0.0, 0.5)
    backward = ih.plugins.make_linear_solver("anderson", m=3, lam=0.1, retry_lam=0.01)
    assert backward == ih.linalg.AndersonSolve(m=3, lam=0.1, retry_lam=0.01)
    assert backward.attempts == (0.1, 0.1)  # the retry never weakens the regularisation
    assert ih.plugins.make_solver("broyden", stop_mode="abs") == ih.Broyden(stop_mode="abs")


@pytest.mark.parametrize(
    ("registered", "cls"),
    [
        ("torchdeq_anderson", ih.solvers.TorchDEQAnderson),
        ("torchdeq_broyden", ih.solvers.TorchDEQBroyden),
    ],
)
def test_torchdeq_solvers_without_torchdeq_name_the_extra(
    monkeypatch: pytest.MonkeyPatch, registered: str, cls: type
) -> None:
    monkeypatch.setitem(sys.modules, "torchdeq", None)  # import torchdeq now fails
    with pytest.raises(ImportError, match=r"needs torchdeq, an optional extra: pip install "):
        cls()
    with pytest.raises(ImportError, match=r"'implicit-ham\[torchdeq\]'"):
        ih.plugins.make_solver(registered)
