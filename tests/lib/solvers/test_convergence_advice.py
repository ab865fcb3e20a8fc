"""The advice of a missed tolerance fits the case: a residual that grew means a map that is not
contractive there; otherwise more steps, or a solver other than the one that ran (the Anderson
solve used to be told to use Anderson)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor

import implicit_ham as ih

F64 = torch.float64


def _message(f: Callable[[Tensor, Tensor], Tensor], solver: ih.FixedPointSolver) -> str:
    x = torch.ones(4, 8, dtype=F64)
    with pytest.warns(ih.ConvergenceWarning) as records:
        ih.fixed_point(f, torch.zeros(4, 8, dtype=F64), x, solver=solver)
    return str(records[0].message)


def _spin(rate: float) -> Callable[[Tensor, Tensor], Tensor]:
    """``z <- rate R z + x``, R a rotation by 1 rad in four planes (no eigenvalue is real)."""
    c, s = torch.cos(torch.tensor(1.0, dtype=F64)), torch.sin(torch.tensor(1.0, dtype=F64))
    rotation = torch.block_diag(*[torch.stack([torch.stack([c, -s]), torch.stack([s, c])])] * 4)
    return lambda z, x: rate * z @ rotation.T + x


def test_a_growing_residual_points_at_the_map_not_the_budget() -> None:
    text = _message(_spin(1.5), ih.FixedPointIteration(max_steps=10, tol=1e-8))
    assert "did not shrink" in text and "not be contractive" in text, text


def test_a_slow_contraction_gets_more_steps_or_another_solver() -> None:
    plain = _message(_spin(0.99), ih.FixedPointIteration(max_steps=5, tol=1e-12))
    assert "raise max_steps, or use an accelerated solver (Anderson, Broyden)" in plain
    accelerated = _message(_spin(0.99), ih.Anderson(max_steps=4, tol=1e-14))
    assert "use Anderson" not in accelerated and "other accelerated solver" in accelerated
