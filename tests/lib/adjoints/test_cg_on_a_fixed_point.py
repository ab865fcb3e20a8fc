"""CG on the implicit backward of a fixed point (a newcomer's mistake, README's solver list):
``I - J^T`` is not symmetric unless ``f`` is a gradient step, so CG's answer is wrong and more
steps do not help. The failure's warning names that cause, with the symmetry probe's numbers,
and the right solvers, instead of "raise max_steps"; on a gradient-step map, whose system is
symmetric positive definite, CG solves it (the gradient against the dense solve of the
equations) and nothing is said."""

from __future__ import annotations

import warnings

import pytest
import torch

import implicit_ham as ih

F64 = torch.float64


def _solve(f, x: torch.Tensor, linear_solver: str) -> tuple[torch.Tensor, list[str]]:
    x = x.clone().requires_grad_()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        solution = ih.fixed_point(
            f, torch.zeros_like(x), x, solver=ih.FixedPointIteration(max_steps=3000, tol=1e-12),
            adjoint=ih.Implicit(linear_solver=linear_solver),
        )  # fmt: skip
        (grad,) = torch.autograd.grad(solution.value.sum(), x)
    return grad, [str(w.message) for w in caught]


def test_cg_on_a_non_symmetric_fixed_point_names_the_cause() -> None:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(16, 16, generator=gen, dtype=F64) * 0.9 / 4
    x = torch.randn(4, 16, generator=gen, dtype=F64)

    def f(z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(z @ weight.T + x)

    exact, quiet = _solve(f, x, "dense")
    assert quiet == []
    wrong, said = _solve(f, x, "cg")
    assert float((wrong - exact).norm() / exact.norm()) > 0.1  # what CG returns here
    (message,) = [m for m in said if "cg did not reach" in m]
    assert "I - J is not symmetric here (u . A(Au) = " in message
    assert "more steps will not help. Use linear_solver='gmres' or 'auto'" in message
    assert "Raise max_steps" not in message


def test_cg_on_a_gradient_step_map_is_right_and_quiet() -> None:
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(16, 16, generator=gen, dtype=F64)
    hessian = a @ a.T / 16 + torch.eye(16, dtype=F64)
    b = torch.randn(4, 16, generator=gen, dtype=F64)

    def step(z: torch.Tensor, b: torch.Tensor) -> torch.Tensor:  # z - eta * grad(z H z / 2 - b z)
        return z - 0.05 * (z @ hessian - b)

    grad, said = _solve(step, b, "cg")
    assert said == []
    # z* = b H^-1, so d(sum z*)/db = 1 H^-1 for every row
    expected = torch.linalg.solve(hessian, torch.ones(16, dtype=F64)).expand(4, 16)
    assert grad == pytest.approx(expected, abs=1e-4)
