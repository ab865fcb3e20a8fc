"""``StepwiseSolver``: a plug-in written as init / step is held to the solver contract, and
the base class measures what the plug-in cannot misreport."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import pytest
import torch

import implicit_ham as ih
from implicit_ham.errors import ConvergenceWarning, NonFiniteError


@dataclass(frozen=True)
class HeavyBall(ih.plugins.StepwiseSolver[tuple[torch.Tensor, ...]]):
    """z_{k+1} = f(z_k) + beta (z_k - z_{k-1}): a momentum fixed-point iteration."""

    max_steps: int = 60
    tol: float | None = None
    beta: float = 0.3

    def init(self, z0, fz0, spec):
        return z0

    def step(self, z, fz, previous):
        return tuple(a + self.beta * (b - p) for a, b, p in zip(fz, z, previous, strict=True)), z


@dataclass(frozen=True)
class StopsAtOnce(HeavyBall):
    """A plug-in whose ``terminate`` claims convergence at the first look."""

    def terminate(self, rel_residual):
        return True


def _linear_problem(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A contraction z -> A z + b (B = 3, n = 5, float64) with spectral norm 0.6."""
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(5, 5, generator=g, dtype=torch.float64))
    a = q @ torch.diag(torch.linspace(-0.6, 0.6, 5, dtype=torch.float64)) @ q.T
    return a, torch.randn(3, 5, generator=g, dtype=torch.float64)


def test_plug_in_passes_the_solver_contract() -> None:
    report = ih.testing.check_solver(HeavyBall(tol=1e-8))
    assert report.ok and not report.skipped


def test_solution_matches_a_dense_solve_and_stats_are_measured() -> None:
    a, b = _linear_problem()
    exact = torch.linalg.solve(torch.eye(5, dtype=torch.float64) - a, b.T).T
    sol = ih.fixed_point(lambda z, b: z @ a.T + b, torch.zeros_like(b), b,
                         solver=HeavyBall(tol=1e-12, max_steps=200))  # fmt: skip
    torch.testing.assert_close(sol.value, exact, rtol=1e-10, atol=1e-10)
    stats = sol.stats
    assert stats.converged is not None and bool(stats.converged.all())
    assert stats.residuals.shape == (stats.steps, 3) and 0 < stats.steps < 200
    recomputed = torch.linalg.vector_norm(sol.value @ a.T + b - sol.value, dim=1)
    torch.testing.assert_close(stats.abs_residual, recomputed)


def test_without_momentum_it_is_plain_iteration_bit_for_bit() -> None:
    a, b = _linear_problem(1)
    z = torch.zeros_like(b)
    for _ in range(7):
        z = z @ a.T + b
    sol = ih.fixed_point(lambda z, b: z @ a.T + b, torch.zeros_like(b), b,
                         solver=HeavyBall(max_steps=7, beta=0.0))  # fmt: skip
    assert torch.equal(sol.value, z) and sol.stats.steps == 7 and sol.stats.converged is None


def test_gradient_through_implicit_matches_the_dense_formula() -> None:
    a, b = _linear_problem(2)
    b = b.clone().requires_grad_(True)
    solver = HeavyBall(tol=1e-12, max_steps=300)
    sol = ih.fixed_point(lambda z, b: z @ a.T + b, torch.zeros_like(b), b, solver=solver,
                         adjoint=ih.Implicit())  # fmt: skip
    weights = torch.randn(3, 5, dtype=torch.float64)
    (grad,) = torch.autograd.grad((sol.value * weights).sum(), b)
    # z* = (I - A)^{-1} b per row, so dL/db = w (I - A)^{-1}
    expected = torch.linalg.solve(torch.eye(5, dtype=torch.float64) - a.T, weights.T).T
    torch.testing.assert_close(grad, expected, rtol=1e-8, atol=1e-10)


def test_a_terminate_that_stops_early_cannot_report_convergence() -> None:
    a, b = _linear_problem(3)
    with pytest.warns(ConvergenceWarning, match="worst relative residual"):
        sol = ih.fixed_point(lambda z, b: z @ a.T + b, torch.zeros_like(b), b,
                             solver=StopsAtOnce(tol=1e-8))  # fmt: skip
    assert sol.stats.steps == 0 and not bool(sol.stats.converged.any())


def test_non_finite_iterate_raises_naming_the_solver() -> None:
    ones = torch.ones(2, 3, dtype=torch.float64)
    with pytest.raises(NonFiniteError, match=r"HeavyBall|heavy"):
        ih.fixed_point(lambda z, x: z * 1e300 + x, ones, ones, solver=HeavyBall(max_steps=5))


def test_a_nan_is_located_at_the_evaluation_that_made_it() -> None:
    """f turns NaN once z passes 4.5: plain steps z + 1 from 0 reach 5 at the 6th evaluation
    (f(z0) is the first). The message names that evaluation, as FixedPointIteration names its
    step, not the end of the budget (it said 51 for a 50-step budget)."""

    def f(z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.where(z > 4.5, torch.full_like(z, float("nan")), z + x)

    ones = torch.ones(2, 3, dtype=torch.float64)
    plain = HeavyBall(max_steps=50, beta=0.0)
    with pytest.raises(NonFiniteError, match="at forward evaluation 6 "):
        ih.fixed_point(f, torch.zeros_like(ones), ones, solver=plain)
    with pytest.raises(NonFiniteError, match="at forward step 6"):
        ih.fixed_point(f, torch.zeros_like(ones), ones, solver=ih.FixedPointIteration(max_steps=50))


def test_tolerance_solve_is_refused_under_vmap() -> None:
    solver = HeavyBall(tol=1e-6)

    def one(x: torch.Tensor) -> torch.Tensor:
        return ih.fixed_point(lambda z, x: 0.5 * z + x, torch.zeros_like(x), x,
                              solver=solver).value  # fmt: skip

    with warnings.catch_warnings(), pytest.raises(NotImplementedError, match="vmap"):
        warnings.simplefilter("ignore")
        torch.func.vmap(one)(torch.ones(4, 2, 3))
