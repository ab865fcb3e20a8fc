"""Implicit reports κ(I - J) from its linear solver and warns above ``cond_threshold``."""

from __future__ import annotations

import warnings

import pytest
import torch

import implicit_ham as ih


def _linear_problem(singular_values: list[float]):
    """f(z, x) = A z + x with I - A having the given singular values (A = I - U S V^T)."""
    gen = torch.Generator().manual_seed(3)
    n = len(singular_values)
    u, _ = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    a = (
        torch.eye(n, dtype=torch.float64)
        - u @ torch.diag(torch.tensor(singular_values, dtype=torch.float64)) @ v.T
    )
    x = torch.randn(1, n, generator=gen, dtype=torch.float64, requires_grad=True)
    return (lambda z, x: z @ a.T + x), x, a


def _backward(adjoint: ih.Implicit, singular_values: list[float]) -> ih.Solution:
    f, x, a = _linear_problem(singular_values)
    z_star = torch.linalg.solve(
        torch.eye(len(singular_values), dtype=torch.float64) - a, x.detach()[0]
    )[None]
    sol = ih.fixed_point(f, z_star, x, solver=ih.FixedPointIteration(max_steps=1), adjoint=adjoint)
    sol.value.sum().backward()
    return sol


def test_dense_reports_the_exact_condition_number() -> None:
    sol = _backward(ih.Implicit("dense", cond_threshold=None), [2.0, 1.0, 0.5, 0.01])
    assert sol.backward_stats.cond == pytest.approx(200.0, rel=1e-9)


def test_gmres_reports_a_lower_bound_that_is_tight_on_a_full_krylov_space() -> None:
    sol = _backward(ih.Implicit("gmres", tol=1e-12, cond_threshold=None), [2.0, 1.0, 0.5, 0.01])
    assert 0.5 * 200.0 <= sol.backward_stats.cond <= 200.0 * (1 + 1e-9)


@pytest.mark.parametrize("solver", ["dense", "gmres"])
def test_ill_conditioned_system_warns_with_the_number(solver: str) -> None:
    with pytest.warns(ih.ConditioningWarning, match=r"cond\(I - J\) >= .*e\+0[3-9]"):
        _backward(ih.Implicit(solver, tol=1e-10, cond_threshold=1e3), [1.0, 0.5, 1e-4])


def test_well_conditioned_system_does_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", ih.ConditioningWarning)
        _backward(ih.Implicit("dense", cond_threshold=1e3), [1.0, 0.9, 0.5])
