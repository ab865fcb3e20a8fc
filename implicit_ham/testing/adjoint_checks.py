"""``check_adjoint``: a backward mode against the contract, on the problem panel.

The gradient a mode must give is defined by the built-in mode it is (or subclasses, or names as
``reference``); ``expected_gradient`` computes it from its definition with the independent
references of ``references.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial

from torch import Tensor

from implicit_ham.adjoints.modes import (
    ADJOINTS,
    Adjoint,
    AtFixedPoint,
    Implicit,
    Neumann,
    OneStep,
    Phantom,
    ThroughIterations,
    Unroll,
)
from implicit_ham.solvers.iteration import FixedPointIteration
from implicit_ham.testing.common import (
    SECOND_ORDER_RTOL,
    Run,
    clear_errors,
    dtype_device_shape,
    matches_fd,
    no_dead_inputs,
    second_derivative,
    solve_and_differentiate,
    values_equal,
)
from implicit_ham.testing.problems import Problem, panel
from implicit_ham.testing.references import (
    Gradient,
    damped_steps_from,
    detach_then_steps,
    gradient_from_adjoint,
    implicit_adjoint,
    neumann_adjoint,
    relative_error,
    vjp_of_step,
)
from implicit_ham.testing.report import (
    AllowSkips,
    Checker,
    ConformanceReport,
    NotApplicableError,
    NotCheckedError,
    require_close,
)

STEPS = 40  # K: with Lipschitz constant <= 0.4, 0.4^40 ~ 1e-16, a converged forward
RELATION_RTOL = 1e-9
FD_RTOL = 1e-6
NEUMANN_LARGE_K = 200


def check_adjoint(
    adjoint: Adjoint,
    *,
    reference: Adjoint | None = None,
    rtol: float | None = None,
    fail_fast: bool = True,
    allow_skips: AllowSkips = False,
) -> ConformanceReport:
    """Run ``adjoint`` with ``FixedPointIteration(max_steps=40)`` on every panel problem.

    Checks (per problem; the gradient ones on the float64 problems):

    * ``value_equals_one_step``: the value is bitwise equal to the value under ``OneStep()``.
    * ``dtype_device_shape``, ``no_dead_inputs``.
    * ``gradient_relation``: the gradient equals the one defined by ``reference`` (default:
      the built-in mode ``adjoint`` is an instance of), computed independently in float64:
      Unroll / Truncated(k) / OneStep / any ``ThroughIterations``: detach after ``K - k``
      steps, then k steps with gradient; Phantom(k, tau): k damped steps from z*;
      Neumann(k, tau): ``(df/dθ)^T tau sum_{i<k} (B^T)^i v``, ``B = tau J + (1 - tau) I``;
      Implicit: ``(df/dθ)^T (I - J^T / (1 + ridge))^{-1} v`` (J by ``torch.func.jacrev``).
      Tolerance ``rtol``: default 1e-9, for Implicit ``max(1e-9, 10 * tol)`` (its own solve
      tolerance). A mode of unknown type without ``reference`` cannot be checked: the check
      is skipped, and the report is not ok unless ``allow_skips`` accepts it.
    * ``unroll_matches_finite_differences`` (Unroll) / ``implicit_matches_finite_differences``
      (Implicit without ridge; a ridge biases the gradient on purpose): against central
      differences (eps 1e-6, 3 random directions) of the K-step loop / the converged fixed
      point; rel. error <= max(1e-6, rtol).
    * ``one_step_at_solution`` (Phantom with k=1, tau=1): ``(df/dθ)^T v`` at z*.
    * ``neumann_large_k_approaches_implicit`` (Neumann): with k=200 the gradient is the
      implicit one (rel. error <= 1e-8).
    * ``second_derivative_or_refusal`` (tanh_f64; Unroll and at-fixed-point modes): under
      ``create_graph=True`` the mode either refuses with an error that says so, or its second
      derivative is the derivative of its own gradient (central differences, rel. <= 1e-5).
      Truncated / OneStep / Phantom: not applicable, theirs is the surrogate's by design; a
      mode of unknown type without ``reference``: skipped (not checked).
    * ``clear_errors`` (tanh_f64): ValueError / TypeError / NonFiniteError on bad input.

    Args:
        adjoint: the backward mode under test.
        reference: the built-in mode whose gradient ``adjoint`` must reproduce (e.g.
            ``Implicit()`` for a new implicit-differentiation mode).
        rtol: the tolerance of ``gradient_relation`` (see above for the default).
        fail_fast: raise ``ConformanceError`` at the first failure, and at the end when a
            check was skipped that ``allow_skips`` does not accept; else collect all.
        allow_skips: accept skipped checks explicitly: True, or their names (e.g.
            ``{"gradient_relation", "second_derivative_or_refusal"}``); they stay listed in
            ``summary()``.
    """
    if not isinstance(adjoint, Adjoint):
        raise TypeError(
            f"check_adjoint expects an ih.plugins.Adjoint instance, got {type(adjoint).__name__}"
        )
    reference = adjoint if reference is None else reference
    rtol = default_rtol(reference) if rtol is None else rtol
    solver = FixedPointIteration(max_steps=STEPS)
    checker = Checker(repr(adjoint), fail_fast, allow_skips)
    for problem in panel():
        runs: list[Run] = []

        def run_both(problem: Problem = problem, runs: list[Run] = runs) -> dict[str, float]:
            runs.append(solve_and_differentiate(problem, solver, adjoint))
            runs.append(solve_and_differentiate(problem, solver, OneStep()))
            return {}

        checker.run("runs", problem.name, run_both)
        if not runs:
            continue
        run = runs[0]
        checker.run("value_equals_one_step", problem.name, partial(values_equal, runs[1], run))
        checker.run("dtype_device_shape", problem.name, partial(dtype_device_shape, problem, run))
        checker.run("no_dead_inputs", problem.name, partial(no_dead_inputs, problem, run))
        if problem.exact:
            _gradient_checks(checker, problem, run, adjoint, reference, rtol)
        if problem.name == "tanh_f64":
            checker.run(
                "clear_errors", problem.name, partial(clear_errors, problem, solver, adjoint)
            )
    return checker.finish()


def default_rtol(reference: Adjoint) -> float:
    """The ``gradient_relation`` tolerance for a mode: 1e-9, or 10 x an Implicit's own tol."""
    if isinstance(reference, Implicit):
        return max(RELATION_RTOL, 10 * reference.tol)
    return RELATION_RTOL


def relation_name(reference: Adjoint) -> str:
    """The registry name of the built-in mode ``reference`` is (or derives from), else its
    class name: the relation its gradient is held to."""
    builtins = {ADJOINTS.get(name): name for name in ADJOINTS.names()}
    for klass in type(reference).__mro__:
        if klass in builtins:
            return builtins[klass]
    return type(reference).__name__


def expected_gradient(reference: Adjoint, problem: Problem, z_star: tuple[Tensor, ...]) -> Gradient:
    """The input gradient ``reference`` defines on ``problem`` after ``STEPS`` plain steps
    (z* their result); NotCheckedError for a mode of unknown type."""
    solver = FixedPointIteration(max_steps=STEPS)
    if isinstance(reference, Unroll):
        return detach_then_steps(problem, STEPS, STEPS)
    if isinstance(reference, ThroughIterations):
        return detach_then_steps(problem, STEPS, min(reference.grad_steps(solver), STEPS))
    if isinstance(reference, Phantom):
        return damped_steps_from(problem, z_star, reference.k, reference.tau)
    if isinstance(reference, Neumann):
        g = neumann_adjoint(problem, z_star, reference.k, reference.tau)
        return gradient_from_adjoint(problem, z_star, g)
    if isinstance(reference, Implicit):
        return gradient_from_adjoint(
            problem, z_star, implicit_adjoint(problem, z_star, reference.ridge)
        )
    raise NotCheckedError(
        f"no reference gradient is known for {type(reference).__name__}, so its gradient was "
        "never compared; pass reference=<the built-in mode whose gradient it must reproduce>"
    )


def _gradient_checks(
    checker: Checker, problem: Problem, run: Run, adjoint: Adjoint, reference: Adjoint, rtol: float
) -> None:
    def relation() -> dict[str, float]:
        expected = expected_gradient(reference, problem, run.value)
        err = relative_error(run.gradient, expected)
        return require_close(err, rtol, f"the gradient is not the one {reference!r} defines")

    checker.run(f"gradient_relation[{relation_name(reference)}]", problem.name, relation)
    fd_tol = max(FD_RTOL, rtol)
    if isinstance(reference, Unroll):
        checker.run(
            "unroll_matches_finite_differences",
            problem.name,
            partial(_fd, problem, run, _k_step_loss(problem), fd_tol),
        )
    if isinstance(reference, Implicit) and reference.ridge == 0:
        checker.run(
            "implicit_matches_finite_differences",
            problem.name,
            partial(_fd, problem, run, _fixed_point_loss(problem), fd_tol),
        )
    if isinstance(adjoint, Phantom) and adjoint.k == 1 and adjoint.tau == 1.0:
        checker.run(
            "one_step_at_solution", problem.name, partial(_one_step_at_solution, problem, run)
        )
    if isinstance(adjoint, Neumann):
        checker.run(
            "neumann_large_k_approaches_implicit",
            problem.name,
            partial(_neumann_large_k, problem, adjoint),
        )
    if problem.name == "tanh_f64":
        checker.run(
            "second_derivative_or_refusal",
            problem.name,
            partial(_second_order, problem, adjoint, reference),
        )


def _second_order(problem: Problem, adjoint: Adjoint, reference: Adjoint) -> dict[str, float]:
    if not isinstance(reference, (ThroughIterations, Phantom, AtFixedPoint)):
        raise NotCheckedError(
            f"which second derivative {type(reference).__name__} must give is not known; pass "
            "reference=<the built-in mode whose gradient it must reproduce>"
        )
    if not isinstance(reference, (Unroll, AtFixedPoint)):
        raise NotApplicableError(
            "a truncated / phantom gradient's second derivative is its surrogate's (the "
            "detached state held fixed), by design; not checked"
        )
    if isinstance(reference, Implicit) and reference.ridge:
        raise NotApplicableError(
            "Implicit(ridge > 0)'s second derivative is the derivative of its regularised "
            "gradient in which z*'s own derivative is again the regularised one (a surrogate, "
            "by design); not checked"
        )
    if isinstance(reference, Neumann):
        raise NotApplicableError(
            "Neumann's second derivative is the derivative of its k-term series in which z*'s "
            "own derivative is again the k-term series (a surrogate, by design), not the "
            "derivative of its gradient along the exact solution map; not checked"
        )
    rtol = SECOND_ORDER_RTOL
    if isinstance(reference, Implicit):  # its linear solves stop at tol (first and second order)
        rtol = max(rtol, 10 * reference.tol)
    return second_derivative(problem, FixedPointIteration(max_steps=STEPS), adjoint, rtol)


def _k_step_loss(problem: Problem) -> Callable[[], Tensor]:
    return lambda: problem.loss(problem.restore(problem.iterate(STEPS)))


def _fixed_point_loss(problem: Problem) -> Callable[[], Tensor]:
    return lambda: problem.loss(problem.restore(problem.plain_fixed_point()))


def _fd(problem: Problem, run: Run, loss: Callable[[], Tensor], tol: float) -> dict[str, float]:
    return matches_fd(
        problem.inputs,
        run.gradient,
        loss,
        tol,
        "the gradient disagrees with central finite differences",
    )


def _one_step_at_solution(problem: Problem, run: Run) -> dict[str, float]:
    expected = vjp_of_step(problem, run.value, problem.weights)
    err = relative_error(run.gradient, expected)
    return require_close(
        err, RELATION_RTOL, "Phantom(k=1, tau=1) is not the one-step gradient at z*"
    )


def _neumann_large_k(problem: Problem, adjoint: Neumann) -> dict[str, float]:
    many = dataclasses.replace(adjoint, k=NEUMANN_LARGE_K)
    run = solve_and_differentiate(problem, FixedPointIteration(max_steps=STEPS), many)
    expected = gradient_from_adjoint(problem, run.value, implicit_adjoint(problem, run.value))
    err = relative_error(run.gradient, expected)
    return require_close(
        err, 1e-8, f"Neumann with k={NEUMANN_LARGE_K} is not the implicit gradient"
    )
