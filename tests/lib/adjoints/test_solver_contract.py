"""A forward solver only finds z*: ``solve(f, z0, spec)`` has no ``grad_steps``. A plug-in that
implements just that gets its gradient from the through-iteration mode itself (``k`` plain
steps of f taken from its z*, the value unchanged), ``Unroll`` is refused with a clear error,
and the conformance kit accepts it. Replaying the solver's own iterates is a capability
(``ReplaysIterates``) that ``FixedPointIteration`` declares."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import pytest
import torch

import implicit_ham as ih
from implicit_ham._core.state import State, StateSpec, StepFn
from implicit_ham._core.stats import SolverStats

DT = torch.float64


@dataclass(frozen=True)
class _PlainSolver(ih.plugins.FixedPointSolver):
    """The smallest plug-in: solves without any gradient, knows nothing of backward modes."""

    max_steps: int = 80
    tol: float | None = None

    def solve(self, f: StepFn, z0: State, spec: StateSpec) -> tuple[State, SolverStats]:
        with torch.no_grad():
            inner = ih.FixedPointIteration(max_steps=self.max_steps, tol=self.tol)
            return inner.solve(f, z0, spec)


def _map(z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(0.5 * z + x)


def test_the_forward_solver_contract_has_no_grad_steps() -> None:
    names = list(inspect.signature(ih.plugins.FixedPointSolver.solve).parameters)
    assert names == ["self", "f", "z0", "spec"]
    for solver in (ih.FixedPointIteration, ih.Anderson, ih.Broyden):
        assert list(inspect.signature(solver.solve).parameters) == names
    assert issubclass(ih.FixedPointIteration, ih.plugins.ReplaysIterates)
    assert not issubclass(ih.Anderson, ih.plugins.ReplaysIterates)


@pytest.mark.parametrize("k", [1, 3])
def test_a_plain_plugin_gets_the_gradient_of_k_steps_from_its_solution(k: int) -> None:
    x = torch.randn(2, 3, dtype=DT, generator=torch.Generator().manual_seed(0))
    x.requires_grad_(True)
    z0 = torch.zeros(2, 3, dtype=DT)
    adjoint = ih.OneStep() if k == 1 else ih.Truncated(k)
    sol = ih.fixed_point(_map, z0, x, solver=_PlainSolver(), adjoint=adjoint)
    (grad,) = torch.autograd.grad(sol.value.sum(), x)
    # the value is the solver's, bit for bit
    plain = ih.fixed_point(_map, z0, x, solver=_PlainSolver(), adjoint=ih.Implicit())
    assert torch.equal(sol.value, plain.value)
    # the chain rule by hand through p_{j+1} = tanh(0.5 p_j + x) from p_0 = z* (a constant):
    # dp_{j+1}/dx = s_{j+1} (1 + 0.5 dp_j/dx), s = 1 - tanh^2
    p, d = sol.value.detach(), torch.zeros_like(x)
    for _ in range(k):
        p = torch.tanh(0.5 * p + x.detach())
        d = (1 - p.square()) * (1 + 0.5 * d)
    torch.testing.assert_close(grad, d, rtol=1e-12, atol=1e-14)


def test_unroll_through_a_plain_plugin_is_refused() -> None:
    x = torch.randn(2, 3, dtype=DT, requires_grad=True)
    with pytest.raises(ValueError, match=r"_PlainSolver runs without gradient and cannot be "):
        ih.fixed_point(_map, torch.zeros(2, 3, dtype=DT), x, solver=_PlainSolver(),
                       adjoint=ih.Unroll())  # fmt: skip


def test_the_at_fixed_point_modes_do_not_need_the_steps_graph() -> None:
    x = torch.randn(2, 3, dtype=DT, requires_grad=True)
    dense = ih.Implicit(linear_solver="dense")
    z0 = torch.zeros(2, 3, dtype=DT)
    sol = ih.fixed_point(_map, z0, x, solver=_PlainSolver(), adjoint=dense)
    (grad,) = torch.autograd.grad(sol.value.sum(), x)
    # dz*/dx = (I - diag(0.5 s))^-1 diag(s), s = 1 - tanh^2, per entry
    s = 1 - sol.value.detach().square()
    torch.testing.assert_close(grad, s / (1 - 0.5 * s), rtol=1e-8, atol=1e-10)


def test_a_map_without_graph_costs_no_extra_evaluation() -> None:
    # the built-in solver, an f that ignores its input: no graph anywhere, no error, and
    # exactly max_steps calls (FixedPointIteration replays its own steps)
    x = torch.randn(2, 3, requires_grad=True)
    calls = []

    def halve(z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return 0.5 * z

    solver = ih.FixedPointIteration(max_steps=7)
    sol = ih.fixed_point(halve, torch.ones(2, 3), x, solver=solver, adjoint=ih.Unroll())
    assert not sol.value.requires_grad and len(calls) == 7


def test_the_conformance_kit_accepts_a_plain_plugin() -> None:
    report = ih.testing.check_solver(_PlainSolver(), fail_fast=False)
    assert not report.failed, [r.describe(report.plugin) for r in report.failed]


def test_the_root_and_argmin_contracts_have_no_grad_steps() -> None:
    root = list(inspect.signature(ih.plugins.RootSolver.solve).parameters)
    assert root == ["self", "g", "z0", "spec"]
    argmin = list(inspect.signature(ih.plugins.Minimizer.minimize).parameters)
    assert argmin == ["self", "objective", "z0"]
    assert issubclass(ih.Newton, ih.plugins.ReplaysIterates)
    assert issubclass(ih.GradientDescent, ih.plugins.ReplaysSteps)
    assert issubclass(ih.GaussNewton, ih.plugins.ReplaysSteps)
    assert not issubclass(ih.LBFGS, ih.plugins.ReplaysSteps)


@dataclass(frozen=True)
class _PlainMinimizer(ih.plugins.Minimizer):
    """A plug-in minimizer that only finds the minimum (gradient descent without gradient)."""

    max_steps: int = 200
    tol: float | None = None

    def minimize(self, objective, z0):  # type: ignore[no-untyped-def]
        inner = ih.GradientDescent(lr=0.5, max_steps=self.max_steps, tol=None)
        with torch.no_grad():
            return inner.minimize(objective, z0)


def test_a_plain_plugin_minimizer_is_refused_by_the_through_iteration_modes_only() -> None:
    x = torch.randn(2, 3, dtype=DT, requires_grad=True)
    z0 = torch.zeros(2, 3, dtype=DT)

    def loss(z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * ((z - x) ** 2).sum(-1)

    with pytest.raises(ValueError, match=r"_PlainMinimizer: its steps .* are not differentiable"):
        ih.minimize(loss, z0, x, solver=_PlainMinimizer(), adjoint=ih.OneStep())
    sol = ih.minimize(loss, z0, x, solver=_PlainMinimizer(), adjoint=ih.Implicit())
    (grad,) = torch.autograd.grad(sol.value.sum(), x)
    torch.testing.assert_close(grad, torch.ones_like(x))  # z* = x, dz*/dx = I
