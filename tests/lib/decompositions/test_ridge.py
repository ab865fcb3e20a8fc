"""``Implicit(ridge=λ)``: the discounted implicit gradient, against a dense float64 formula on
a linear fixed-point map, its limits (λ = 0: implicit, λ -> inf: one-step) and bad input."""

from __future__ import annotations

import pytest
import torch

import implicit_ham as ih

DT = torch.float64


def _linear_problem(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A (5, 5) with spectral radius 0.95, B (5, 3), x (2, 3): ``z = z A^T + x B^T``."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(5, 5, dtype=DT, generator=gen)
    a = 0.95 * a / torch.linalg.eigvals(a).abs().max()
    b = torch.randn(5, 3, dtype=DT, generator=gen)
    x = torch.randn(2, 3, dtype=DT, generator=gen)
    return a, b, x


def _grad(a: torch.Tensor, b: torch.Tensor, x: torch.Tensor, adjoint: ih.Implicit) -> torch.Tensor:
    xx = x.clone().requires_grad_()
    sol = ih.fixed_point(
        lambda z, x_: z @ a.T + x_ @ b.T,
        torch.zeros(2, 5, dtype=DT),
        xx,
        solver=ih.FixedPointIteration(max_steps=2000, tol=1e-14),
        adjoint=adjoint,
    )
    weight = torch.linspace(-1.0, 1.0, 10, dtype=DT).reshape(2, 5)
    (grad,) = torch.autograd.grad((weight * sol.value).sum(), xx)
    return grad


@pytest.mark.parametrize("linear_solver", ["dense", "gmres"])
@pytest.mark.parametrize("ridge", [0.0, 0.3, 4.0])
def test_ridge_gradient_matches_the_discounted_formula(linear_solver: str, ridge: float) -> None:
    a, b, x = _linear_problem()
    weight = torch.linspace(-1.0, 1.0, 10, dtype=DT).reshape(2, 5)
    system = torch.eye(5, dtype=DT) - a.T / (1.0 + ridge)
    expected = torch.linalg.solve(system, weight.T).T @ b  # g_i = (I - A^T/(1+λ))^-1 v_i
    got = _grad(a, b, x, ih.Implicit(linear_solver=linear_solver, tol=1e-12, ridge=ridge))
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-10)


def test_zero_ridge_is_the_exact_implicit_gradient_and_a_large_one_the_one_step() -> None:
    a, b, x = _linear_problem(1)
    exact = _grad(a, b, x, ih.Implicit(linear_solver="dense"))
    tiny = _grad(a, b, x, ih.Implicit(linear_solver="gmres", tol=1e-12, ridge=1e-9))
    torch.testing.assert_close(tiny, exact, rtol=1e-7, atol=1e-8)
    one_step = torch.linspace(-1.0, 1.0, 10, dtype=DT).reshape(2, 5) @ b
    far = _grad(a, b, x, ih.Implicit(linear_solver="dense", ridge=1e9))
    torch.testing.assert_close(far, one_step, rtol=1e-7, atol=1e-8)


def test_ridge_makes_a_singular_system_solvable() -> None:
    """f(z, x) = z + (x - x_0): J = I, df/dx = I and every z is a fixed point at x = x_0.
    λ = 0 has no solution; λ = 1 solves g = g / 2 + v, so g = 2 v and dL/dx = 2 v."""
    x = torch.randn(3, dtype=DT, requires_grad=True)
    x0 = x.detach().clone()
    sol = ih.fixed_point(
        lambda z, x_: z + (x_ - x0),
        torch.zeros(3, dtype=DT),
        x,
        solver=ih.FixedPointIteration(max_steps=2),
        adjoint=ih.Implicit(linear_solver="gmres", tol=1e-10, ridge=1.0, on_divergence="raise"),
    )
    weight = torch.tensor([1.0, -2.0, 0.5], dtype=DT)
    (weight * sol.value).sum().backward()
    torch.testing.assert_close(x.grad, 2 * weight)
    record = sol.backward_log[-1]
    assert record.converged and record.rel_residual < 1e-10


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf"), "big", True])
def test_a_bad_ridge_is_refused_with_its_meaning(bad: object) -> None:
    with pytest.raises(ValueError, match="ridge must be a finite number >= 0"):
        ih.Implicit(ridge=bad)  # type: ignore[arg-type]
