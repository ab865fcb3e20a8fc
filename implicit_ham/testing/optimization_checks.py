"""``check_root_solver`` and ``check_minimizer``: solvers of the root / argmin layers against the
contract, on the panels of ``optimization_problems.py``."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch

from implicit_ham._core.errors import NonFiniteError
from implicit_ham.adjoints.modes import Adjoint, Implicit, Neumann, OneStep
from implicit_ham.problems.fixed_point import Solution
from implicit_ham.problems.least_squares import least_squares
from implicit_ham.problems.minimize import minimize
from implicit_ham.problems.root import root
from implicit_ham.solvers.base import FixedPointSolver
from implicit_ham.solvers.minimizers import Minimizer
from implicit_ham.solvers.newton import RootSolver
from implicit_ham.testing.common import expect_error
from implicit_ham.testing.optimization_problems import (
    OptProblem,
    argmin_panel,
    ift_gradient,
    root_panel,
)
from implicit_ham.testing.problems import as_tuple
from implicit_ham.testing.references import relative_error
from implicit_ham.testing.report import Checker, ConformanceReport, require, require_close

VALUE_ATOL = {torch.float64: 1e-6, torch.float32: 1e-3}
GRADIENT_RTOL = 1e-7
EXACT = Implicit(linear_solver="dense", tol=1e-12, on_divergence="raise")
SUITES = ("panel", "peers", "mgh")

Solve = Callable[[OptProblem, Adjoint], Solution]


def check_root_solver(
    solver: RootSolver | FixedPointSolver, *, fail_fast: bool = True
) -> ConformanceReport:
    """Run ``ih.root(..., solver=solver)`` on every root-panel problem.

    Checks (per problem):

    * ``finds_the_root``: the value is the independent reference root (a closed form or a
      dense Newton loop) within 1e-6 (float64) / 1e-3 (float32), shaped, typed and placed
      like z0; ``stats`` has one residual per sample.
    * ``value_independent_of_the_mode``: the value is bitwise equal under
      ``Implicit(dense)``, ``Implicit(gmres)``, ``Neumann`` and (when the solver accepts it)
      ``OneStep``.
    * ``implicit_gradient_matches_ift`` (float64): ``Implicit(dense)``'s input gradient is
      ``-(dg/dθ)^T (dg/dz)^{-T} v`` computed densely (rel. <= 1e-7).
    * ``clear_errors`` (cube_f64): ValueError for a g of the wrong shape, NonFiniteError
      for NaN in z0.
    """
    if not isinstance(solver, (RootSolver, FixedPointSolver)):
        raise TypeError(
            "check_root_solver expects an ih.plugins.RootSolver or ih.plugins.FixedPointSolver, "
            f"got {type(solver).__name__}"
        )

    def solve(problem: OptProblem, adjoint: Adjoint) -> Solution:
        return root(problem.fn, problem.z0, *problem.args, solver=solver, adjoint=adjoint)

    return _run(repr(solver), root_panel(), solve, False, fail_fast)


def check_minimizer(
    minimizer: Minimizer, *, fail_fast: bool = True, suite: str = "panel"
) -> ConformanceReport:
    """Run ``minimizer`` on every argmin-panel problem (``ih.least_squares`` for a solver that
    needs residuals, ``ih.minimize`` of ``½||r||²`` otherwise), with the checks of
    ``check_root_solver`` on the optimality condition ``grad_z loss = 0``.

    ``suite="peers"`` runs it on the peers' own test cases instead (Theseus, jaxopt,
    optimistix, TorchOpt: ``implicit_ham.testing.peer_cases``), ``suite="mgh"`` on the
    Moré-Garbow-Hillstrom set (``implicit_ham.testing.mgh``); see ``suite_checks``.
    """
    if not isinstance(minimizer, Minimizer):
        raise TypeError(
            f"check_minimizer expects an ih.plugins.Minimizer, got {type(minimizer).__name__}"
        )
    if suite not in SUITES:
        choices = ", ".join(SUITES)
        raise ValueError(f"check_minimizer: suite must be one of {choices}, got {suite!r}")
    if suite != "panel":
        from implicit_ham.testing import suite_checks

        run_suite = suite_checks.peer_suite if suite == "peers" else suite_checks.mgh_suite
        return run_suite(minimizer, fail_fast)

    def solve(problem: OptProblem, adjoint: Adjoint) -> Solution:
        if minimizer.needs_residuals:
            return least_squares(
                problem.fn, problem.z0, *problem.args, solver=minimizer, adjoint=adjoint
            )
        return minimize(
            problem.objective, problem.z0, *problem.args, solver=minimizer, adjoint=adjoint
        )

    return _run(repr(minimizer), argmin_panel(), solve, True, fail_fast)


def _run(
    name: str, problems: list[OptProblem], solve: Solve, argmin: bool, fail_fast: bool
) -> ConformanceReport:
    checker = Checker(name, fail_fast)
    for problem in problems:
        checker.run("finds_the_root", problem.name, partial(_finds_root, problem, solve))
        checker.run(
            "value_independent_of_the_mode", problem.name, partial(_same_value, problem, solve)
        )
        if problem.exact:
            checker.run(
                "implicit_gradient_matches_ift",
                problem.name,
                partial(_gradient, problem, solve, argmin),
            )
        if problem.name in ("cube_f64", "ridge_f64"):
            checker.run(
                "clear_errors", problem.name, partial(_clear_errors, problem, solve, argmin)
            )
    return checker.finish()


def _finds_root(problem: OptProblem, solve: Solve) -> dict[str, float]:
    sol = solve(problem, EXACT)
    value, reference = as_tuple(sol.value), problem.reference()
    for v, z in zip(value, as_tuple(problem.z0), strict=True):
        require(
            v.shape == z.shape and v.dtype == z.dtype and v.device == z.device,
            f"the value is {v.dtype} {tuple(v.shape)} on {v.device}; z0 is {z.dtype} "
            f"{tuple(z.shape)} on {z.device}",
        )
    batch = as_tuple(problem.z0)[0].shape[0]
    require(
        tuple(sol.stats.abs_residual.shape) == (batch,),
        f"stats.abs_residual has shape {tuple(sol.stats.abs_residual.shape)}, expected ({batch},)",
    )
    err = max(float((v - r).abs().max()) for v, r in zip(value, reference, strict=True))
    tol = VALUE_ATOL[as_tuple(problem.z0)[0].dtype]
    require(err <= tol, "the value is not the reference solution", max_abs_error=err, tol=tol)
    return {"max_abs_error": err, "tol": tol}


def _same_value(problem: OptProblem, solve: Solve) -> dict[str, float]:
    first = as_tuple(solve(problem, EXACT).value)
    modes: list[Adjoint] = [Implicit(linear_solver="gmres"), Neumann(), OneStep()]
    compared = 0
    for mode in modes:
        try:
            other = as_tuple(solve(problem, mode).value)
        except ValueError as err:
            if isinstance(mode, OneStep) and "not differentiable" in str(err):
                continue  # a solver without differentiable steps refuses OneStep, loudly
            raise
        diff = max(float((a - b).detach().abs().max()) for a, b in zip(first, other, strict=True))
        require(
            all(torch.equal(a, b) for a, b in zip(first, other, strict=True)),
            f"the value under {mode.name} differs from the value under implicit",
            max_abs_diff=diff,
        )
        compared += 1
    return {"modes_compared": float(compared)}


def _gradient(problem: OptProblem, solve: Solve, argmin: bool) -> dict[str, float]:
    sol = solve(problem, EXACT)
    loss = problem.loss(sol.value)
    grads = torch.autograd.grad(loss, problem.args, allow_unused=True)
    got = tuple(
        torch.zeros_like(a) if g is None else g for g, a in zip(grads, problem.args, strict=True)
    )
    expected = ift_gradient(problem, as_tuple(sol.value), argmin)
    err = relative_error(got, expected)
    return require_close(err, GRADIENT_RTOL, "the implicit gradient is not -(dg/dθ)^T (dg/dz)^-T v")


def _clear_errors(problem: OptProblem, solve: Solve, argmin: bool) -> dict[str, float]:
    z0 = as_tuple(problem.z0)[0]
    cases: list[tuple[str, OptProblem, type[Exception]]] = [
        ("NaN in z0", _replace(problem, z0=torch.full_like(z0, math.nan)), NonFiniteError)
    ]
    if not argmin:  # a least-squares residual may have any shape; g must match z
        wrong = _replace(problem, fn=lambda z, *a: problem.fn(z, *a)[..., :-1])
        cases.append(("g of the wrong shape", wrong, ValueError))
    for what, case, expected in cases:
        expect_error(what, partial(solve, case, EXACT), expected)
    return {}


def _replace(problem: OptProblem, **changes: object) -> OptProblem:
    fields = {**problem.__dict__, **changes}
    return OptProblem(**fields)
