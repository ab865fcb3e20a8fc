"""The torchdeq 0.1.0 pitfalls listed in docs/solvers.md, each guarded (the ones not tested here
are in test_core_errors.py: unknown keys; test_core_semantics.py: eval-mode graph, second backward;
test_core_gradients.py: gradcheck of the implicit backward with a fixed-point linear solver)."""

from __future__ import annotations

import logging

import pytest
import torch
from helpers.host_sync import HostSyncCounter
from helpers.registry_names import with_torchdeq
from torch import Tensor

import implicit_ham as ih

DT = torch.float64
# f(z) = z / 2 + C has the fixed point 2C, exact in floating point (C is dyadic)
C = torch.tensor([[0.25, -1.5, 3.0], [1.0, 0.5, -0.125]], dtype=DT)


def halving(z: Tensor) -> Tensor:
    return 0.5 * z + C


def test_the_pitfall_torchdeq_anderson_is_singular_at_the_fixed_point_without_lam() -> None:
    """A zero residual history makes torchdeq's mixing system singular (guarded below)."""
    anderson_solver = pytest.importorskip("torchdeq.solver").anderson_solver
    with pytest.raises(torch.linalg.LinAlgError):
        anderson_solver(halving, 2 * C, max_iter=6, tol=-1.0, m=3, lam=0.0)


@pytest.mark.parametrize(
    "solver_cls", [with_torchdeq(ih.solvers.TorchDEQAnderson, "torchdeq_anderson"), ih.Anderson]
)
def test_anderson_without_regularisation_started_at_the_fixed_point(caplog, solver_cls) -> None:
    with caplog.at_level(logging.WARNING, logger="implicit_ham"):
        sol = ih.fixed_point(
            halving,
            2 * C,
            solver=solver_cls(lam=0.0, m=3, max_steps=8, tol=None),  # no early stop
            adjoint="implicit",
        )
    assert "retrying" in caplog.text
    torch.testing.assert_close(sol.value, 2 * C, rtol=1e-15, atol=0)
    assert bool((sol.stats.abs_residual == 0).all())


@pytest.mark.parametrize("solver_cls", [ih.Anderson, ih.Broyden])
@pytest.mark.parametrize("tol", [1e-4, None])
@pytest.mark.filterwarnings("ignore::implicit_ham.ConvergenceWarning")  # 8 steps are too few
def test_reported_residual_is_the_residual_of_the_returned_value(tanh_problem, solver_cls, tol):
    problem = tanh_problem(batch=3, width=6, contraction=0.9)
    solver = solver_cls(max_steps=8, tol=tol)
    sol = ih.fixed_point(problem.f, problem.z0, *problem.args, solver=solver, adjoint="implicit")
    with torch.no_grad():
        residual = (problem.f(sol.value, *problem.args) - sol.value).norm(dim=1)
    assert bool((residual > 1e-9).all())  # far from rounding: an earlier iterate would differ
    torch.testing.assert_close(sol.stats.abs_residual, residual, rtol=1e-10, atol=0)
    torch.testing.assert_close(
        sol.stats.rel_residual, residual / problem.f(sol.value, *problem.args).norm(dim=1)
    )


@pytest.mark.parametrize(
    "solver",
    [ih.Anderson(max_steps=60, tol=1e-9), ih.Broyden(max_steps=60, tol=1e-9)],
    ids=["anderson", "broyden"],
)
def test_accelerated_solvers_find_the_plain_iteration_fixed_point(tanh_problem, solver) -> None:
    """(Anderson's absolute regularisation lam=1e-4 stalls it near a relative residual of 1e-11,
    hence tol=1e-9 rather than a tighter one.)"""
    problem = tanh_problem(batch=3, width=6, contraction=0.8)
    plain = ih.fixed_point(
        problem.f, problem.z0, *problem.args, solver=ih.FixedPointIteration(200, tol=1e-14)
    )
    accelerated = ih.fixed_point(problem.f, problem.z0, *problem.args, solver=solver)
    assert bool(plain.stats.converged.all()) and bool(accelerated.stats.converged.all())
    torch.testing.assert_close(accelerated.value, plain.value, rtol=0, atol=1e-8)


@pytest.mark.parametrize(
    "solver",
    [
        ih.FixedPointIteration(max_steps=8),
        ih.Anderson(max_steps=8, tol=None),
        ih.Broyden(max_steps=8, tol=None),
    ],
    ids=["fixed_point", "anderson", "broyden"],
)
@pytest.mark.parametrize("adjoint", [ih.OneStep(), ih.Implicit()], ids=["one_step", "implicit"])
def test_forward_solvers_respect_their_evaluation_budget(tanh_problem, solver, adjoint) -> None:
    problem = tanh_problem()
    calls = []

    def counted(z: Tensor, x: Tensor, W: Tensor) -> Tensor:
        calls.append(1)
        return problem.f(z, x, W)

    with torch.no_grad():  # no extra evaluation of f for the backward graph
        sol = ih.fixed_point(counted, problem.z0, *problem.args, solver=solver, adjoint=adjoint)
    assert len(calls) <= solver.max_steps and sol.stats.steps <= solver.max_steps


def count_syncs(problem, max_steps: int, check_finite: bool, adjoint: ih.plugins.Adjoint) -> int:
    solver = ih.FixedPointIteration(max_steps=max_steps, check_finite=check_finite)
    with HostSyncCounter() as counter:
        ih.fixed_point(problem.f, problem.z0, *problem.args, solver=solver, adjoint=adjoint)
    return counter.syncs


def test_the_counter_sees_host_synchronisations(tanh_problem) -> None:
    problem = tanh_problem()
    solver = ih.FixedPointIteration(max_steps=5, tol=1e-30)  # a tolerance checks every step
    with HostSyncCounter() as counter, pytest.warns(ih.ConvergenceWarning, match="tol=1e-30"):
        ih.fixed_point(problem.f, problem.z0, *problem.args, solver=solver)
    assert counter.syncs >= 5


@pytest.mark.parametrize("check_finite", [True, False])
@pytest.mark.parametrize("adjoint", [ih.OneStep(), ih.Unroll()], ids=["one_step", "unroll"])
def test_fixed_budget_iteration_has_no_host_sync_per_step(tanh_problem, check_finite, adjoint):
    problem = tanh_problem()
    few, many = (count_syncs(problem, steps, check_finite, adjoint) for steps in (2, 20))
    assert few == many
    # documented: one sync per solve for the finiteness check, none without it
    assert many == (1 if check_finite else 0)
