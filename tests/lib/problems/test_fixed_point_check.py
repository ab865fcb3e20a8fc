"""The at-fixed-point modes (Implicit, Neumann) check that they differentiate at a fixed point:
a diverged or truncated forward is never silently differentiated with the implicit-function
theorem. Reference values are worked out by hand from the maps' equations."""

from __future__ import annotations

import warnings

import pytest
import torch

import implicit_ham as ih

DT = torch.float64


def diverging(adjoint: ih.plugins.Adjoint) -> tuple[ih.Solution, torch.Tensor]:
    """The report's case: z <- 1.5 z + x from 0, 20 steps (it diverges)."""
    x = torch.linspace(-1.0, 1.0, 32, dtype=DT).reshape(4, 8).requires_grad_()
    sol = ih.fixed_point(
        lambda z, x: 1.5 * z + x,
        torch.zeros(4, 8, dtype=DT),
        x,
        solver=ih.FixedPointIteration(max_steps=20),
        adjoint=adjoint,
    )
    return sol, x


def expected_residual() -> float:
    """After 20 steps z = x (1.5^20 - 1) / 0.5, so f(z) - z = 0.5 z + x = 1.5^20 x and
    f(z) = x (3 * 1.5^20 - 2): the relative residual is 1.5^20 / (3 * 1.5^20 - 2)."""
    return 1.5**20 / (3 * 1.5**20 - 2)


@pytest.mark.parametrize(
    "adjoint", [ih.Implicit(), ih.Implicit(linear_solver="dense"), ih.Neumann()]
)
def test_a_diverged_forward_warns_with_its_residual_and_is_flagged(adjoint) -> None:
    sol, _ = diverging(adjoint)
    with pytest.warns(ih.NotFixedPointWarning, match="not a fixed point") as record:
        sol.value.sum().backward()
    assert f"{expected_residual():.3e}" in str(record[0].message)
    stats = sol.backward_stats
    assert stats.at_fixed_point is False
    assert stats.forward_residual == pytest.approx(expected_residual(), rel=1e-12)


def test_a_diverged_forward_raises_when_asked() -> None:
    sol, _ = diverging(ih.Implicit(on_divergence="raise"))
    with pytest.raises(ih.NotFixedPointError, match=r"relative residual .* > fixed_point_tol"):
        sol.value.sum().backward()


@pytest.mark.parametrize("adjoint", [ih.Implicit, ih.Neumann])
def test_fallback_gives_the_one_step_gradient(adjoint) -> None:
    """For f = 1.5 z + x, df/dx = I: the one-step gradient of sum(z*) is all ones (the
    implicit one would be (1 - 1.5)^-1 = -2, meaningless at a diverged point)."""
    sol, x = diverging(adjoint(on_divergence="fallback"))
    with pytest.warns(ih.NotFixedPointWarning, match="one-step gradient"):
        (grad,) = torch.autograd.grad(sol.value.sum(), x)
    torch.testing.assert_close(grad, torch.ones_like(x), rtol=0, atol=0)
    assert sol.backward_stats.fallback is True and sol.backward_stats.steps == 0


def test_a_converged_forward_passes_the_check_silently() -> None:
    W = torch.eye(6, dtype=DT) * 0.5
    x = torch.randn(3, 6, dtype=DT, requires_grad=True)
    sol = ih.fixed_point(
        lambda z, x: torch.tanh(z @ W + x),
        torch.zeros(3, 6, dtype=DT),
        x,
        solver=ih.FixedPointIteration(max_steps=200, tol=1e-12),
        adjoint=ih.Implicit(tol=1e-12),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sol.value.sum().backward()
    assert sol.backward_stats.at_fixed_point is True
    assert sol.backward_stats.forward_residual <= 1e-11


def test_the_check_can_be_disabled_and_its_tolerance_chosen() -> None:
    sol, _ = diverging(ih.Implicit(fixed_point_tol=None))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ih.NotFixedPointWarning)
        sol.value.sum().backward()
    assert sol.backward_stats.at_fixed_point is None
    sol, _ = diverging(ih.Implicit(fixed_point_tol=0.5))  # 0.333 < 0.5: accepted
    sol.value.sum().backward()
    assert sol.backward_stats.at_fixed_point is True


@pytest.mark.parametrize("bad", [-1.0, 0.0, float("nan"), "1e-3"])
def test_fixed_point_tol_is_validated(bad) -> None:
    with pytest.raises((ValueError, TypeError), match="fixed_point_tol"):
        ih.Implicit(fixed_point_tol=bad)
    with pytest.raises((ValueError, TypeError), match="fixed_point_tol"):
        ih.Neumann(fixed_point_tol=bad)


def test_a_hamburger_with_a_truncated_solve_is_flagged_per_layer() -> None:
    """NMF's six steps are not a fixed point: the implicit gradient says so."""
    torch.manual_seed(0)
    ham = ih.NMF(rank=3, steps=6, adjoint=ih.Implicit(linear_solver="gmres", max_steps=5))
    x = torch.rand(2, 8, 4, 4, requires_grad=True)
    with pytest.warns(ih.NotFixedPointWarning):
        ham(x).sum().backward()
    stats = ham.last_solution.backward_stats
    assert stats.at_fixed_point is False and stats.forward_residual > 1e-3


def test_check_conditioning_warns_at_a_point_that_is_not_a_fixed_point() -> None:
    problem = ih.FixedPointProblem(lambda z: 1.5 * z + 1.0, torch.zeros(1, 4, dtype=DT))
    with pytest.warns(ih.NotFixedPointWarning, match="not a fixed point"):
        report = ih.diagnostics.check_conditioning(
            problem, solver=ih.FixedPointIteration(max_steps=10), lanczos_steps=4, krylov_dim=4
        )
    assert report.fixed_point_residual > 0.1
