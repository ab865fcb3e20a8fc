"""Budgets mean what they say (issue 45, item 9): ``FixedPointIteration(tol=...)`` without
``max_steps`` runs to its tolerance, and ``Anderson`` / ``Broyden(max_steps=K)`` spend exactly K
evaluations of ``f`` in their iteration, counted here by a wrapped ``f``."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import Tensor

import implicit_ham as ih


def slow_contraction() -> tuple[Tensor, Tensor]:
    """``A`` (12, 12) symmetric with spectral radius 0.8 and b (3, 12), float64: plain
    iteration needs about 60 steps to a relative residual of 1e-6."""
    gen = torch.Generator().manual_seed(0)
    q, _ = torch.linalg.qr(torch.randn(12, 12, generator=gen, dtype=torch.float64))
    eigenvalues = torch.linspace(-0.8, 0.8, 12, dtype=torch.float64)
    return q @ torch.diag(eigenvalues) @ q.T, torch.randn(3, 12, generator=gen, dtype=torch.float64)


def test_a_tolerance_without_max_steps_runs_to_the_tolerance() -> None:
    a, b = slow_contraction()
    solver = ih.FixedPointIteration(tol=1e-6)
    assert solver.max_steps == ih.solvers.iteration.DEFAULT_TOL_STEPS
    with warnings.catch_warnings():
        warnings.simplefilter("error", ih.ConvergenceWarning)
        sol = ih.fixed_point(lambda z, b: z @ a.T + b, torch.zeros(3, 12, dtype=torch.float64), b,
                             solver=solver)  # fmt: skip
    assert sol.stats.converged is not None and bool(sol.stats.converged.all())
    assert 6 < sol.stats.steps < solver.max_steps
    exact = torch.linalg.solve(torch.eye(12, dtype=torch.float64) - a, b.T).T
    torch.testing.assert_close(sol.value, exact, rtol=1e-4, atol=1e-5)


def test_fixed_budgets_are_kept() -> None:
    assert ih.FixedPointIteration().max_steps == 6  # Hamburger's K without a tolerance
    assert ih.FixedPointIteration(max_steps=6, tol=1e-6).max_steps == 6  # as given
    assert ih.FixedPointIteration(max_steps=30).max_steps == 30
    with pytest.raises(ValueError, match="max_steps must be an integer >= 1"):
        ih.FixedPointIteration(max_steps=-1)


def tanh_cell() -> tuple[Tensor, Tensor]:
    """W (64, 64) at spectral norm 1.5 and x (1, 64), float64: one sample whose residual
    decreases at every one of 30 Anderson or Broyden evaluations (so its best iterate is the
    latest evaluation and the returned point needs no measurement)."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(64, 64, generator=gen, dtype=torch.float64)
    weight = weight * 1.5 / torch.linalg.matrix_norm(weight, ord=2)
    return weight, torch.randn(1, 64, generator=gen, dtype=torch.float64)


@pytest.mark.parametrize("name", ["anderson", "broyden"])
def test_accelerated_budget_is_the_number_of_evaluations(name: str) -> None:
    """``max_steps=30`` without a tolerance: the iteration evaluates f exactly 30 times
    (before: 29). On top, a backward mode's own evaluations at z*: OneStep's gradient step,
    Implicit's evaluation with gradient for its vector-Jacobian products (the same one as
    after ``FixedPointIteration``)."""
    weight, x = tanh_cell()
    calls: list[int] = []

    def f(z: Tensor, x: Tensor) -> Tensor:
        calls.append(1)
        return torch.tanh(z @ weight.T + x)

    solver = ih.plugins.make_solver(name, max_steps=30, tol=None)
    z0 = torch.zeros(1, 64, dtype=torch.float64)
    with torch.no_grad():
        sol = ih.fixed_point(f, z0, x, solver=solver)
    trace = sol.stats.residuals[:, 0]
    assert bool((trace[1:] < trace[:-1]).all())  # the premise: the latest iterate is the best
    assert (len(calls), sol.stats.steps) == (30, 30)
    plain: list[int] = []
    for adjoint in ("implicit", "one_step"):
        for counter, method in ((calls, solver), (plain, ih.FixedPointIteration(max_steps=30))):
            counter.clear()

            def g(z: Tensor, x: Tensor, counter: list[int] = counter) -> Tensor:
                counter.append(1)
                return torch.tanh(z @ weight.T + x)

            ih.fixed_point(g, z0, x.clone().requires_grad_(), solver=method, adjoint=adjoint)
        # the iteration's 30 and the backward mode's own evaluation at z*, which
        # FixedPointIteration(max_steps=30) counts among its 30 under OneStep only
        expected = 30 + 1
        assert len(calls) == expected, adjoint
        assert len(plain) == (31 if adjoint == "implicit" else 30), adjoint


@pytest.mark.parametrize("name", ["anderson", "broyden"])
def test_a_measured_return_costs_one_evaluation(name: str) -> None:
    """Several samples whose best iterates come from different evaluations: the iteration's
    30 evaluations and one at the returned point (its check as one batch), no more."""
    a, b = slow_contraction()
    scales = torch.tensor([0.2, 1.0, 0.05], dtype=torch.float64)[:, None]
    calls: list[int] = []

    def f(z: Tensor, b: Tensor) -> Tensor:
        calls.append(1)
        return scales * (z @ a.T) + b

    with torch.no_grad():
        solver = ih.plugins.make_solver(name, max_steps=30, tol=None)
        sol = ih.fixed_point(f, torch.zeros(3, 12, dtype=torch.float64), b, solver=solver)
    assert sol.stats.steps == 30
    assert len(calls) in (30, 31)
    z = sol.value
    residual = torch.linalg.vector_norm(f(z, b) - z, dim=1)
    torch.testing.assert_close(sol.stats.abs_residual, residual, rtol=1e-9, atol=1e-15)


def test_fixed_point_runs_to_a_tolerance_by_default() -> None:
    """``ih.fixed_point(f, z0, x)`` without a solver: plain iteration to a relative residual of
    1e-5 (before: 6 steps, no tolerance), checked against the dense solve of z = A z + b."""
    a, b = slow_contraction()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ih.ConvergenceWarning)
        sol = ih.fixed_point(lambda z, b: z @ a.T + b, torch.zeros(3, 12, dtype=torch.float64), b)
    assert sol.stats.converged is not None and bool(sol.stats.converged.all())
    assert sol.stats.steps > 6
    exact = torch.linalg.solve(torch.eye(12, dtype=torch.float64) - a, b.T).T
    error = torch.linalg.vector_norm(sol.value - exact, dim=1) / torch.linalg.vector_norm(
        exact, dim=1
    )
    assert bool((error < 1e-4).all())  # ||z - z*|| <= residual / (1 - 0.8), relative to ||z*||


def test_the_default_inside_vmap_runs_its_whole_budget() -> None:
    """Inside vmap no tolerance can be checked: the default runs the tolerance's budget (100
    steps) without stopping, so the value is at least as converged as outside vmap (checked
    against the dense solve of z = A z + b); an explicit tolerance is still refused there."""
    a, b = slow_contraction()

    def solve(b: Tensor) -> Tensor:
        return ih.fixed_point(
            lambda z, b: z @ a.T + b, torch.zeros(3, 12, dtype=torch.float64), b
        ).value

    rhs = torch.stack((b, 2 * b))
    values = torch.func.vmap(solve)(rhs)
    eye = torch.eye(12, dtype=torch.float64)
    for value, r in zip(values, rhs, strict=True):
        exact = torch.linalg.solve(eye - a, r.T).T
        # 0.8^100 ~ 2e-10 of the initial error is left
        torch.testing.assert_close(value, exact, rtol=1e-8, atol=1e-9)
    grads = torch.func.vmap(torch.func.grad(lambda b: solve(b).sum()))(rhs)
    assert grads.shape == rhs.shape and bool(torch.isfinite(grads).all())
    with pytest.raises(NotImplementedError, match=r"solver=FixedPointIteration\(max_steps=K\)"):
        torch.func.vmap(
            lambda b: ih.fixed_point(
                lambda z, b: z @ a.T + b, torch.zeros(3, 12, dtype=torch.float64), b,
                solver=ih.FixedPointIteration(tol=1e-5),
            ).value
        )(rhs)  # fmt: skip
