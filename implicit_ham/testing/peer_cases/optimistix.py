"""optimistix (patrick-kidger/optimistix): ``tests/test_fixed_point.py``,
``tests/test_root_find.py``, ``tests/test_least_squares.py`` and ``tests/test_minimise.py`` on
the problem set of ``tests/helpers.py`` (``optimistix_problems``).

Assertions carried over (``tree_allclose``: atol = rtol):

* fixed point (``FixedPointIteration(rtol=atol=1e-6)``, 10 000 steps): ``f(y*) ≈ y*`` at 1e-4;
  the JVP against finite differences at 1e-3.
* root find (``Newton(rtol=atol=1e-6)``) of ``f(y) - y``: ``≈ 0`` at 1e-5; the JVP at 1e-5.
* least squares (every solver, 10 000 steps): ``Σ r(y*)² ≈`` the minimum at 1e-4; the JVP at
  1e-2. test_minimise.py (LM, rtol = atol = 1e-5): the minimum at 1e-2.
* minimisation: the minimum at 1e-4 (the tolerance of test_least_squares; the stored
  test_minimise.py predates this set and states none for it).

A JVP here is checked in reverse mode: the autograd derivative of ``<w, y*>`` along random
directions of the args against central differences (``directional_error``; the start's tangent
is left out: y* does not depend on it, both sides give 0).
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor

from implicit_ham.adjoints.modes import Implicit
from implicit_ham.problems.fixed_point import fixed_point
from implicit_ham.problems.least_squares import least_squares
from implicit_ham.problems.minimize import minimize
from implicit_ham.problems.root import root
from implicit_ham.solvers.iteration import FixedPointIteration
from implicit_ham.solvers.least_squares import GaussNewton, LevenbergMarquardt
from implicit_ham.solvers.minimizers import Minimizer
from implicit_ham.solvers.newton import Newton
from implicit_ham.solvers.quasi_newton import LBFGS
from implicit_ham.testing.peer_cases.common import (
    PeerCase,
    directional_error,
    grad_check,
    not_applicable,
    one,
    require_allclose,
)
from implicit_ham.testing.peer_cases.optimistix_problems import (
    Problem,
    fixed_point_problems,
    least_squares_problems,
    minimisation_problems,
    test_minimise_problems,
)
from implicit_ham.testing.report import require

PEER = "optimistix"
FP, RF, LS, MIN = (
    "tests/test_fixed_point.py",
    "tests/test_root_find.py",
    "tests/test_least_squares.py",
    "tests/test_minimise.py",
)
FPI = FixedPointIteration(max_steps=10_000, tol=1e-6, stop_mode="abs")
PENALTY_NOTE = (
    "; optimistix's penalty II differs from Moré-Garbow-Hillstrom's (exp(x_i/10) - "
    "exp(x_(i-1)/10) where MGH adds them), so its minimum is 1.23e-3, not the stated 2.93660e-4: "
    "the stated tolerance 1e-2 passes both (MGH's own penalty II runs in the MGH set)"
)
NEWTON = Newton(linear_solver="dense", max_steps=100, tol=1e-10)


def _fixed_point_value(p: Problem, _: Minimizer | None) -> dict[str, float]:
    y = one(fixed_point(p.fn, p.y0, *p.args, solver=FPI))
    return require_allclose(p.fn(y, *p.args), y, 1e-4, 1e-4, "f(y*) vs y*")


def _fixed_point_jvp(p: Problem, _: Minimizer | None) -> dict[str, float]:
    def solve(*args: Tensor) -> Tensor:
        return one(fixed_point(p.fn, p.y0, *args, solver=FPI, adjoint=Implicit()))

    return grad_check(directional_error(solve, p.args, 1e-6), 1e-3, "the JVP")


def _root_problem(p: Problem) -> object:
    return lambda y, *args: p.fn(y, *args) - y


def _root_value(p: Problem, _: Minimizer | None) -> dict[str, float]:
    g = _root_problem(p)
    y = one(root(g, p.y0, *p.args, solver=NEWTON))  # type: ignore[arg-type]
    value = g(y, *p.args)  # type: ignore[operator]
    return require_allclose(value, torch.zeros_like(value), 1e-5, 1e-5, "f(y*) - y*")


def _root_jvp(p: Problem, _: Minimizer | None) -> dict[str, float]:
    g = _root_problem(p)

    def solve(*args: Tensor) -> Tensor:
        return one(root(g, p.y0, *args, solver=NEWTON, adjoint=Implicit(linear_solver="dense")))  # type: ignore[arg-type]

    return grad_check(directional_error(solve, p.args, 1e-6), 1e-5, "the JVP")


def _minimum(
    p: Problem, solver: Minimizer, tol: float, minimizer: Minimizer | None
) -> dict[str, float]:
    solver = solver if minimizer is None else minimizer
    y = one(least_squares(p.fn, p.y0, *p.args, solver=solver))
    found = float((p.fn(y, *p.args) ** 2).sum())
    require(
        abs(found - p.minimum) <= tol * (1 + abs(p.minimum)),
        "not the minimum",
        minimum=found,
        expected=p.minimum,
        tol=tol,
    )
    return {"minimum": found}


def _least_squares_jvp(
    p: Problem, solver: Minimizer, minimizer: Minimizer | None
) -> dict[str, float]:
    solver = solver if minimizer is None else minimizer

    def solve(*args: Tensor) -> Tensor:
        return one(
            least_squares(p.fn, p.y0, *args, solver=solver, adjoint=Implicit(linear_solver="dense"))
        )

    return grad_check(directional_error(solve, p.args, 1e-6), 1e-2, "the JVP")


def _minimise(p: Problem, minimizer: Minimizer | None) -> dict[str, float]:
    solver = LBFGS(max_steps=10_000) if minimizer is None else minimizer
    y = one(minimize(p.fn, p.y0, *p.args, solver=solver))
    found = float(p.fn(y, *p.args).sum())
    require(
        abs(found - p.minimum) <= 1e-4 * (1 + abs(p.minimum)),
        "not the minimum",
        minimum=found,
        expected=p.minimum,
    )
    return {"minimum": found}


def _lm_minimise(p: Problem, minimizer: Minimizer | None) -> dict[str, float]:
    return _minimum(p, LevenbergMarquardt(max_steps=10_000), 1e-2, minimizer)


def cases() -> list[PeerCase]:
    """optimistix's cases (see the module docstring)."""
    out: list[PeerCase] = []
    fpi = "FixedPointIteration(tol=1e-6, stop_mode='abs', max_steps=10_000)"
    for p in fixed_point_problems():
        out += [
            PeerCase(
                PEER,
                f"{FP}::test_fixed_point",
                f"fixed_point_{p.name}",
                partial(_fixed_point_value, p),
                fpi,
            ),
            PeerCase(
                PEER,
                f"{FP}::test_fixed_point_jvp",
                f"fixed_point_jvp_{p.name}",
                partial(_fixed_point_jvp, p),
                f"{fpi}, Implicit(); float64",
            ),
            PeerCase(
                PEER,
                f"{RF}::test_root_find",
                f"root_newton_{p.name}",
                partial(_root_value, p),
                "Newton(linear_solver='dense', tol=1e-10)",
            ),
            PeerCase(
                PEER,
                f"{RF}::test_root_find_jvp",
                f"root_jvp_{p.name}",
                partial(_root_jvp, p),
                "Newton(dense), Implicit(dense)",
            ),
        ]
    out += [
        not_applicable(
            PEER,
            f"{FP}::test_fixed_point_jvp",
            "fixed_point_jvp_complex128",
            "complex128 states: the layers here are real-valued",
        ),
        not_applicable(
            PEER,
            f"{FP}::test_bisection",
            "bisection",
            "Bisection (a bracketing scalar root finder): no counterpart",
        ),
        not_applicable(
            PEER,
            f"{RF}::test_root_find",
            "root_chord",
            "Chord (Newton with a frozen Jacobian): no counterpart",
        ),
        not_applicable(
            PEER, f"{RF}::test_bisection_flip", "bisection_flip", "Bisection: no counterpart"
        ),
        not_applicable(
            PEER,
            f"{RF}::test_newton_bounded",
            "newton_bounded",
            "Newton with lower / upper bounds (options=): no counterpart",
        ),
        not_applicable(
            PEER,
            f"{FP}::test_fixed_point",
            "has_aux",
            "has_aux (every test, drawn at random): no counterpart; each case runs without aux",
        ),
        not_applicable(
            PEER,
            f"{LS}::test_least_squares",
            "throw_false",
            "throw=False (return the iterate of a failed solve silently): ours "
            "always returns and warns (ConvergenceWarning) with the numbers",
        ),
    ]
    solvers = (
        ("gauss_newton", GaussNewton(max_steps=10_000)),
        ("levenberg_marquardt", LevenbergMarquardt(max_steps=10_000)),
        ("lbfgs", LBFGS(max_steps=10_000)),
    )
    for p in least_squares_problems():
        if p.name == "simple_nn":
            out.append(
                not_applicable(
                    PEER,
                    f"{LS}::test_least_squares_jvp",
                    "least_squares_jvp_simple_nn",
                    "refused: the Hessian at the fit is singular (dead ReLU units; κ ~ 3e32); "
                    "optimistix solves it with a pseudo-inverse (AutoLinearSolver(well_posed="
                    "False)), ours has no pseudo-inverse backward solve and raises "
                    "NonFiniteError naming κ",
                )
            )
        for label, solver in solvers:
            out.append(
                PeerCase(
                    PEER,
                    f"{LS}::test_least_squares",
                    f"least_squares_{p.name}_{label}",
                    partial(_minimum, p, solver, 1e-4),
                    f"least_squares({solver!r})",
                    takes_minimizer=True,
                )
            )
        if p.name != "simple_nn":
            out.append(
                PeerCase(
                    PEER,
                    f"{LS}::test_least_squares_jvp",
                    f"least_squares_jvp_{p.name}",
                    partial(_least_squares_jvp, p, LevenbergMarquardt(max_steps=10_000)),
                    "LevenbergMarquardt, Implicit(dense)",
                    takes_minimizer=True,
                    slow=p.name == "diagonal_bowl",
                )
            )
    out.append(
        not_applicable(
            PEER,
            f"{LS}::test_least_squares",
            "least_squares_other_solvers",
            "Dogleg, DoglegMax, IndirectLevenbergMarquardt, BFGS / DFP variants, NelderMead, "
            "NonlinearCG, optax minimisers: no counterparts (GaussNewton, LevenbergMarquardt and "
            "LBFGS run every problem)",
        )
    )
    for p in minimisation_problems():
        out.append(
            PeerCase(
                PEER,
                "tests/helpers.py::minimisation_fn_minima_init_args",
                f"minimise_{p.name}",
                partial(_minimise, p),
                "minimize(LBFGS(max_steps=10_000))",
                takes_minimizer=True,
                loss_only=True,
            )
        )
    for p in test_minimise_problems():
        out.append(
            PeerCase(
                PEER,
                f"{MIN}::test_minimise",
                f"lm_minimise_{p.name}",
                partial(_lm_minimise, p),
                "least_squares(LevenbergMarquardt(max_steps=10_000))"
                + (PENALTY_NOTE if p.name == "penalty_ii" else ""),
                takes_minimizer=True,
                slow=p.name in ("penalty_ii", "trigonometric"),
            )
        )
    return out
