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
    """Unscaled, so that the bound is of κ(I - J) itself; κ stays unknown (None)."""
    adjoint = ih.Implicit("gmres", tol=1e-12, cond_threshold=None, scaling=False)
    stats = _backward(adjoint, [2.0, 1.0, 0.5, 0.01]).backward_stats
    assert stats.cond is None
    assert stats.cond_lower_bound is not None
    assert 0.5 * 200.0 <= stats.cond_lower_bound <= 200.0 * (1 + 1e-9)


@pytest.mark.parametrize(("solver", "relation"), [("dense", "="), ("gmres", ">=")])
def test_ill_conditioned_system_warns_with_the_number(solver: str, relation: str) -> None:
    pattern = rf"κ\(I - J\) {relation} .*e\+0[3-9]"
    adjoint = ih.Implicit(solver, tol=1e-10, cond_threshold=1e3, scaling=False)
    with pytest.warns(ih.ConditioningWarning, match=pattern) as caught:
        _backward(adjoint, [1.0, 0.5, 1e-4])
    (message,) = [str(w.message) for w in caught if w.category is ih.ConditioningWarning]
    assert message.startswith("implicit backward: ") and f"exceeds 1.0e+03 ({solver}, " in message
    assert "error bound κ * residual = " in message


def test_well_conditioned_system_does_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", ih.ConditioningWarning)
        _backward(ih.Implicit("dense", cond_threshold=1e3), [1.0, 0.9, 0.5])


def _slow_map_problem():
    """tanh map with spectral radius ~0.95 (a 2-VJP Neumann solve cannot converge)."""
    gen = torch.Generator().manual_seed(5)
    q, _ = torch.linalg.qr(torch.randn(6, 6, generator=gen, dtype=torch.float64))
    w = 0.95 * q
    x = torch.randn(2, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    return (lambda z, x: torch.tanh(z @ w.T + x)), x


def test_fallback_replaces_a_failed_solve_by_the_one_step_gradient() -> None:
    f, x = _slow_map_problem()
    adjoint = ih.Implicit("fixed_point", max_steps=2, tol=1e-10, on_divergence="fallback")
    sol = ih.fixed_point(
        f,
        torch.zeros(2, 6, dtype=torch.float64),
        x,
        solver=ih.FixedPointIteration(max_steps=200),
        adjoint=adjoint,
    )
    v = torch.randn(2, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with pytest.warns(ih.ConvergenceWarning, match="fallback"):
        (grad,) = torch.autograd.grad((sol.value * v).sum(), x)
    z_star = sol.value.detach()
    x_ref = x.detach().requires_grad_()
    (expected,) = torch.autograd.grad((f(z_star, x_ref) * v).sum(), x_ref)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-14)
    assert sol.backward_stats.fallback and sol.backward_stats.converged is False


def test_raise_policy_raises_backward_solve_error() -> None:
    f, x = _slow_map_problem()
    adjoint = ih.Implicit("fixed_point", max_steps=2, tol=1e-10, on_divergence="raise")
    sol = ih.fixed_point(
        f,
        torch.zeros(2, 6, dtype=torch.float64),
        x,
        solver=ih.FixedPointIteration(max_steps=200),
        adjoint=adjoint,
    )
    with pytest.raises(ih.errors.BackwardSolveError, match="did not reach tol=1e-10"):
        sol.value.sum().backward()
