"""A plug-in solver that runs the steps a through-iteration mode differentiates without gradient
is refused at the solve (``SolverContractError``), not left to give no gradient silently (a
newcomer trial registered one and got ``x.grad is None`` under Unroll / OneStep, no warning)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import implicit_ham as ih
from implicit_ham._core.state import State, StateSpec, StepFn
from implicit_ham._core.stats import SolverStats
from implicit_ham.errors import SolverContractError


@dataclass(frozen=True)
class _NoGradSolver(ih.plugins.FixedPointSolver):
    """Breaks the contract: every step without gradient, whatever ``grad_steps`` asks."""

    max_steps: int = 20
    tol: float | None = None

    def solve(
        self, f: StepFn, z0: State, spec: StateSpec, grad_steps: int = 0
    ) -> tuple[State, SolverStats]:
        with torch.no_grad():
            return ih.FixedPointIteration(max_steps=self.max_steps).solve(f, z0, spec, 0)


def _map(z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(0.5 * z + x)


@pytest.mark.parametrize("adjoint", [ih.Unroll(), ih.Truncated(3), ih.OneStep()])
def test_a_solver_that_drops_the_graph_is_refused_under_through_iteration_modes(
    adjoint: ih.plugins.Adjoint,
) -> None:
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    z0 = torch.zeros(2, 3, dtype=torch.float64)
    with pytest.raises(SolverContractError, match=r"_no_grad_solver|grad_steps=\d+"):
        ih.fixed_point(_map, z0, x, solver=_NoGradSolver(), adjoint=adjoint)
    # without gradient there is nothing to lose: the same solve runs
    with torch.no_grad():
        ih.fixed_point(_map, z0, x, solver=_NoGradSolver(), adjoint=adjoint)


def test_the_at_fixed_point_modes_do_not_need_the_steps_graph() -> None:
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    dense = ih.Implicit(linear_solver="dense")
    z0 = torch.zeros(2, 3, dtype=torch.float64)
    sol = ih.fixed_point(_map, z0, x, solver=_NoGradSolver(max_steps=80), adjoint=dense)
    (grad,) = torch.autograd.grad(sol.value.sum(), x)
    # dz*/dx = (I - diag(0.5 s))^-1 diag(s), s = 1 - tanh^2, per entry
    s = 1 - sol.value.detach().square()
    torch.testing.assert_close(grad, s / (1 - 0.5 * s), rtol=1e-8, atol=1e-10)


def test_a_map_without_graph_is_not_mistaken_for_a_broken_solver() -> None:
    # the built-in solver, an f that ignores its input: no graph anywhere, no error, and no
    # probe evaluation either (the library's solvers are not probed: exactly max_steps calls)
    x = torch.randn(2, 3, requires_grad=True)
    calls = []

    def halve(z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return 0.5 * z

    solver = ih.FixedPointIteration(max_steps=7)
    sol = ih.fixed_point(halve, torch.ones(2, 3), x, solver=solver, adjoint=ih.Unroll())
    assert not sol.value.requires_grad and len(calls) == 7


def test_the_conformance_kit_reports_it() -> None:
    report = ih.testing.check_solver(_NoGradSolver(), fail_fast=False)
    lost = [r for r in report.failed if "SolverContractError" in (r.detail or "")]
    assert lost, [r.describe(report.plugin) for r in report.failed]
