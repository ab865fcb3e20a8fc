"""``check_solver``: a forward solver against the contract, on the problem panel."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from functools import partial

from torch import Tensor

from implicit_ham.adjoints.modes import (
    Adjoint,
    Implicit,
    Neumann,
    OneStep,
    Phantom,
    Truncated,
    Unroll,
)
from implicit_ham.linalg.dense import Dense
from implicit_ham.problems.fixed_point import fixed_point
from implicit_ham.solvers.base import FixedPointSolver
from implicit_ham.testing.common import (
    Run,
    clear_errors,
    dtype_device_shape,
    matches_fd,
    no_dead_inputs,
    solve_and_differentiate,
    solve_or_skip,
)
from implicit_ham.testing.convergence_checks import (
    converged_flag_honest,
    converged_none_without_tolerance,
)
from implicit_ham.testing.problems import Problem, panel
from implicit_ham.testing.references import directional_errors, relative_error
from implicit_ham.testing.report import (
    AllowSkips,
    Checker,
    ConformanceReport,
    NotCheckedError,
    require,
)
from implicit_ham.testing.value_checks import value_independent

UNROLL_FD_RTOL = 1e-6
TIGHT_TOL = 1e-12
TIGHT_VALUE_RTOL = 1e-9
IMPLICIT_FD_RTOL = 1e-6


def default_modes() -> list[Adjoint]:
    """The backward modes ``check_solver`` compares by default (no fixed-point check: the
    solver's default budget need not converge)."""
    return [
        OneStep(),
        Unroll(),
        Truncated(2),
        Phantom(k=2, tau=0.5),
        Implicit(linear_solver=Dense(), fixed_point_tol=None, cond_threshold=None),
        Neumann(k=3, tau=0.5, fixed_point_tol=None),
    ]


def check_solver(
    solver: FixedPointSolver,
    *,
    adjoints: Sequence[Adjoint] | None = None,
    fail_fast: bool = True,
    allow_skips: AllowSkips = False,
) -> ConformanceReport:
    """Run ``solver`` on every panel problem and check the solver contract.

    Checks (per problem; the gradient ones on the float64 problems):

    * ``value_independent_of_adjoint``: the value is bitwise equal (``torch.equal``) under every
      mode of ``adjoints`` (default ``default_modes()``); a mode the solver refuses with a
      ValueError (torchdeq's solvers refuse Unroll) is skipped. The first mode must be accepted.
      A failure gives the difference in eps of the dtype and says when it is a kernel
      difference between grad and no-grad mode (``implicit_ham.testing.value_checks``).
    * ``converged_flag_honest``: every sample the solver calls converged has, recomputed at
      the returned value, the residual its tolerance promises (as given, and with a tolerance
      set; ``implicit_ham.testing.convergence_checks``).
    * ``converged_none_without_tolerance``: without a tolerance (the solver as given, or with
      ``tol=None`` set by ``dataclasses.replace``) ``stats.converged`` is None: there is no
      tolerance to have converged to.
    * ``dtype_device_shape`` and ``no_dead_inputs`` under every accepted mode.
    * ``unroll_matches_finite_differences``: the Unroll gradient against central differences
      (eps 1e-6, 3 random directions) of the solver's own value; rel. error <= 1e-6.
    * ``implicit_matches_finite_differences``: the solver with ``tol=1e-12`` (and at least
      300 steps, via ``dataclasses.replace``; skipped, not checked, if that fails) lands within 1e-9
      (relative) of the fixed point of an independent plain loop, and Implicit(Dense) at its
      solution agrees with central differences of that fixed point, rel. error <= 1e-6.
    * ``clear_errors`` (tanh_f64): a wrong-shaped f -> ValueError, a dtype change ->
      TypeError, NaN in z0 -> NonFiniteError.

    Args:
        solver: the solver under test (its own settings are used, except for the tight solve).
        adjoints: the backward modes to compare; default ``default_modes()``.
        fail_fast: raise ``ConformanceError`` at the first failure, and at the end when a
            check was skipped (not checked) that ``allow_skips`` does not accept.
        allow_skips: accept skipped checks explicitly: True, or their names.

    Returns:
        The ``ConformanceReport`` (``ok`` when ``fail_fast``).
    """
    if not isinstance(solver, FixedPointSolver):
        raise TypeError(
            "check_solver expects an ih.plugins.FixedPointSolver instance, got "
            f"{type(solver).__name__}"
        )
    modes = list(default_modes() if adjoints is None else adjoints)
    checker = Checker(repr(solver), fail_fast, allow_skips)
    for problem in panel():
        runs: list[Run] = []
        accepted: list[Adjoint] = []
        checker.run(
            "runs_under_every_mode",
            problem.name,
            partial(_run_all, problem, solver, modes, runs, accepted),
        )
        for mode, run in zip(accepted[1:], runs[1:], strict=True):
            checker.run(
                "value_independent_of_adjoint",
                problem.name,
                partial(value_independent, problem, solver, (accepted[0], mode), (runs[0], run)),
            )
        checker.run(
            "converged_flag_honest", problem.name, partial(converged_flag_honest, problem, solver)
        )
        checker.run(
            "converged_none_without_tolerance",
            problem.name,
            partial(converged_none_without_tolerance, problem, solver),
        )
        for run in runs:
            checker.run(
                f"dtype_device_shape[{run.mode}]",
                problem.name,
                partial(dtype_device_shape, problem, run),
            )
            checker.run(
                f"no_dead_inputs[{run.mode}]", problem.name, partial(no_dead_inputs, problem, run)
            )
        if problem.exact:
            checker.run(
                "unroll_matches_finite_differences",
                problem.name,
                partial(_unroll_vs_fd, problem, solver),
            )
            checker.run(
                "implicit_matches_finite_differences",
                problem.name,
                partial(_tight_implicit_vs_fd, problem, solver),
            )
        if problem.name == "tanh_f64":
            checker.run(
                "clear_errors", problem.name, partial(clear_errors, problem, solver, OneStep())
            )
    return checker.finish()


def _run_all(
    problem: Problem,
    solver: FixedPointSolver,
    modes: list[Adjoint],
    runs: list[Run],
    accepted: list[Adjoint],
) -> dict[str, float]:
    refused = []
    for i, mode in enumerate(modes):
        try:
            runs.append(solve_and_differentiate(problem, solver, mode))
            accepted.append(mode)
        except ValueError as err:
            require(i > 0, f"the solver refuses the first mode {mode!r}: {err}")
            refused.append(mode.name)
    return {"modes_run": len(runs), "modes_refused": len(refused)}


def _unroll_vs_fd(problem: Problem, solver: FixedPointSolver) -> dict[str, float]:
    run = solve_or_skip(problem, solver, Unroll())

    def loss() -> Tensor:
        sol = fixed_point(problem.f, problem.z0, *problem.args, solver=solver, adjoint=OneStep())
        return problem.loss(sol.value)

    return matches_fd(
        problem.inputs,
        run.gradient,
        loss,
        UNROLL_FD_RTOL,
        "the Unroll gradient disagrees with finite differences of the solver's value",
    )


def tightened(solver: FixedPointSolver) -> FixedPointSolver:
    """``solver`` with ``tol=1e-12`` and at least 300 steps; skips when it is not a dataclass
    with ``max_steps`` and ``tol`` fields."""
    try:
        tight = dataclasses.replace(  # type: ignore[type-var]
            solver, max_steps=max(solver.max_steps, 300), tol=TIGHT_TOL
        )
        return tight
    except (TypeError, ValueError) as err:
        raise NotCheckedError(
            f"cannot tighten {solver!r} (dataclasses.replace: {err}); make it a dataclass with "
            "max_steps and tol fields"
        ) from err


def _tight_implicit_vs_fd(problem: Problem, solver: FixedPointSolver) -> dict[str, float]:
    tight = tightened(solver)
    adjoint = Implicit(
        linear_solver=Dense(), tol=1e-12, fixed_point_tol=1e-8, on_divergence="raise"
    )
    run = solve_and_differentiate(problem, tight, adjoint)
    reference = problem.plain_fixed_point()
    value_err = relative_error(run.value, reference)
    require(
        value_err <= TIGHT_VALUE_RTOL,
        f"{tight!r} does not reach the fixed point",
        value_rel_error=value_err,
        tol=TIGHT_VALUE_RTOL,
    )
    err, _ = directional_errors(
        problem.inputs,
        run.gradient,
        lambda: problem.loss(problem.restore(problem.plain_fixed_point())),
    )
    require(
        err <= IMPLICIT_FD_RTOL,
        "the implicit gradient at the tight solution disagrees with "
        "finite differences of the fixed point",
        rel_error=err,
        tol=IMPLICIT_FD_RTOL,
    )
    return {"value_rel_error": value_err, "rel_error": err, "tol": IMPLICIT_FD_RTOL}
