"""``check_linear_solver``: a linear solver for the implicit backward pass against the
contract: it must solve ``g = J^T g + v`` (checked against a dense solve)."""

from __future__ import annotations

from functools import partial

import torch

from implicit_ham.adjoints.modes import Implicit
from implicit_ham.linalg.operator import AdjointOperator, LinearSolver
from implicit_ham.solvers.iteration import FixedPointIteration
from implicit_ham.testing.adjoint_checks import STEPS
from implicit_ham.testing.common import dtype_device_shape, no_dead_inputs, solve_and_differentiate
from implicit_ham.testing.problems import Problem, panel, spd_panel
from implicit_ham.testing.references import (
    gradient_from_adjoint,
    implicit_adjoint,
    jacobian,
    relative_error,
)
from implicit_ham.testing.report import Checker, ConformanceReport, require, require_close

SOLVE_TOL = 1e-10
SOLVE_BUDGET = 200
SOLVE_RTOL = 1e-7


def check_linear_solver(
    linear_solver: LinearSolver, *, fail_fast: bool = True
) -> ConformanceReport:
    """Run ``linear_solver`` on the systems of every non-empty panel problem.

    Checks:

    * ``solve_matches_dense`` (float64): ``linear_solver.solve(op, v, 200, 1e-10)`` with ``op``
      the explicit ``J^T`` at the fixed point (J by ``torch.func.jacrev``; the whole batch
      is one system, so batch-coupled problems couple the samples) returns g (M,) of v's
      dtype and device with ``||g - g_dense|| / ||g_dense|| <= 1e-7``, ``g_dense`` from
      ``torch.linalg.solve(I - J^T, v)``.
    * ``implicit_gradient_matches_dense`` (float64): ``Implicit(linear_solver, tol=1e-10)``
      through ``fixed_point`` gives the input gradient ``(df/dθ)^T g_dense`` (rel. <= 1e-7).
    * ``dtype_device_shape`` and ``no_dead_inputs`` of that run (float32 included, tol 1e-5).

    A solver with ``requires_spd = True`` (CG) is run on ``spd_panel()`` instead (systems
    ``I - J`` that are symmetric positive definite), and must also pass
    ``refuses_indefinite``: on the indefinite system ``diag(2, -1, 1)`` it raises an error
    (``NotPositiveDefiniteError`` for the built-in CG) instead of returning an answer.

    Args:
        linear_solver: the solver under test.
        fail_fast: raise ``ConformanceError`` at the first failure; else collect all.
    """
    if not isinstance(linear_solver, LinearSolver):
        raise TypeError(
            "check_linear_solver expects an ih.plugins.LinearSolver, got "
            f"{type(linear_solver).__name__}"
        )
    checker = Checker(repr(linear_solver), fail_fast)
    if linear_solver.requires_spd:
        checker.run("refuses_indefinite", "diag(2,-1,1)", partial(_indefinite, linear_solver))
    for problem in spd_panel() if linear_solver.requires_spd else panel():
        if problem.batch == 0:
            continue  # the implicit backward never solves for an empty batch
        if problem.exact:
            checker.run(
                "solve_matches_dense", problem.name, partial(_solve, problem, linear_solver)
            )
        checker.run(
            "implicit_gradient_matches_dense",
            problem.name,
            partial(_through_layer, problem, linear_solver),
        )
    return checker.finish()


def _solve(problem: Problem, linear_solver: LinearSolver) -> dict[str, float]:
    z_star = problem.plain_fixed_point()
    jac = jacobian(problem, z_star)
    v = torch.cat([w.reshape(-1) for w in problem.weights])
    op = AdjointOperator(
        vjp=lambda g: jac.T @ g, vjp_batched=lambda rows: rows @ jac, size=v.numel()
    )
    g, steps, _ = linear_solver.solve(op, v, SOLVE_BUDGET, SOLVE_TOL)
    require(
        isinstance(g, torch.Tensor)
        and g.shape == v.shape
        and g.dtype == v.dtype
        and g.device == v.device,
        f"solve returned {type(g).__name__} "
        f"{getattr(g, 'dtype', '')} {tuple(getattr(g, 'shape', ()))}, expected {v.dtype} "
        f"{tuple(v.shape)} on {v.device}",
    )
    expected = torch.linalg.solve(torch.eye(v.numel(), dtype=v.dtype) - jac.T, v)
    err = float((g - expected).norm() / expected.norm())
    require(
        err <= SOLVE_RTOL,
        "g does not solve g = J^T g + v",
        rel_error=err,
        tol=SOLVE_RTOL,
        steps=float(steps),
    )
    return {"rel_error": err, "tol": SOLVE_RTOL, "steps": float(steps)}


def _through_layer(problem: Problem, linear_solver: LinearSolver) -> dict[str, float]:
    tol = SOLVE_TOL if problem.exact else 1e-5
    adjoint = Implicit(
        linear_solver=linear_solver, max_steps=SOLVE_BUDGET, tol=tol, on_divergence="raise"
    )
    run = solve_and_differentiate(problem, FixedPointIteration(max_steps=STEPS), adjoint)
    dtype_device_shape(problem, run)
    no_dead_inputs(problem, run)
    if not problem.exact:
        return {}  # float32: it ran, with the right dtypes and live gradients
    expected = gradient_from_adjoint(problem, run.value, implicit_adjoint(problem, run.value))
    err = relative_error(run.gradient, expected)
    return require_close(err, SOLVE_RTOL, "the implicit gradient is not (df/dθ)^T (I - J^T)^{-1} v")


def _indefinite(linear_solver: LinearSolver) -> dict[str, float]:
    matrix = torch.diag(torch.tensor([2.0, -1.0, 1.0], dtype=torch.float64))
    op = AdjointOperator(
        vjp=lambda g: g - matrix @ g,
        vjp_batched=lambda rows: rows - rows @ matrix,
        size=3,
        system=lambda g: matrix @ g,
        system_batched=lambda rows: rows @ matrix,
        label="test matrix",
    )
    v = torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64)
    try:
        g, _, _ = linear_solver.solve(op, v, SOLVE_BUDGET, SOLVE_TOL)
    except (RuntimeError, ValueError) as err:
        require(bool(str(err)), "the refusal has no message")
        return {}
    require(False, f"returned {g.tolist()} on an indefinite system instead of refusing")
    return {}
