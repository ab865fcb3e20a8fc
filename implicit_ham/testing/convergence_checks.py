"""``converged_flag_honest``: a solver's ``stats.converged`` is checked against the residual
recomputed independently at the value it returns; ``converged_none_without_tolerance``: without
a tolerance it is None.

A solver that reports ``converged=True`` lets every caller (``GuardedStep``, the implicit
backward's fixed-point check, the failure reports) trust its value as a fixed point. The check
solves each panel problem with the solver as given (when it has a tolerance) and with a
tolerance set by ``dataclasses.replace`` (``HONEST_TOL`` for the dtype, at least
``HONEST_MIN_STEPS`` steps), then, for every sample the solver calls converged, evaluates f once
at the returned value (a plain call, without the library) and requires
``||f(z) - z|| / ||f(z)||`` (``stop_mode="rel"``, the default) or ``||f(z) - z||`` ("abs")
within ``HONEST_SLACK`` times the tolerance (or ``HONEST_FLOOR_EPS`` eps of the dtype, the
rounding floor of the recomputation, whichever is larger). The slack allows for a solver that
measures the residual of the iterate before the one it returns, as ``FixedPointIteration``
does; a flag that is off by more is dishonest.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import Tensor

from implicit_ham.adjoints.modes import OneStep
from implicit_ham.problems.fixed_point import fixed_point
from implicit_ham.solvers.base import FixedPointSolver
from implicit_ham.testing.problems import Problem, as_tuple
from implicit_ham.testing.report import NotApplicableError, NotCheckedError, require

HONEST_TOL = {torch.float64: 1e-8, torch.float32: 1e-4}
HONEST_MIN_STEPS = 100
HONEST_SLACK = 10.0
HONEST_FLOOR_EPS = 100.0


def _per_sample_norm(parts: tuple[Tensor, ...]) -> Tensor:
    """(B,) Euclidean norm over every non-batch entry of every tensor, in float64."""
    squares = [t.detach().double().reshape(t.shape[0], -1).square().sum(1) for t in parts]
    return torch.stack(squares).sum(0).sqrt()


def recomputed_residual(problem: Problem, value: tuple[Tensor, ...], stop_mode: str) -> Tensor:
    """(B,) ``||f(z) - z||`` (``stop_mode="abs"``) or that over ``||f(z)||`` ("rel") at z."""
    with torch.no_grad():
        fz = problem.step(value)
    absolute = _per_sample_norm(tuple(a - b for a, b in zip(fz, value, strict=True)))
    if stop_mode == "abs":
        return absolute
    return absolute / _per_sample_norm(fz).clamp_min(torch.finfo(torch.float64).tiny)


def with_tolerance(solver: FixedPointSolver, tol: float) -> FixedPointSolver | None:
    """``solver`` with ``tol`` and at least ``HONEST_MIN_STEPS`` steps, or None when it is not a
    dataclass with those fields."""
    try:
        return dataclasses.replace(  # type: ignore[type-var]
            solver, tol=tol, max_steps=max(solver.max_steps, HONEST_MIN_STEPS)
        )
    except (TypeError, ValueError):
        return None


def converged_flag_honest(problem: Problem, solver: FixedPointSolver) -> dict[str, float]:
    """Require every ``converged=True`` sample to have the residual it claims (module
    docstring); skipped on an empty batch and when the solver has no tolerance to check."""
    if problem.batch == 0:
        raise NotApplicableError("an empty batch has no sample to check")
    tol = HONEST_TOL.get(problem.dtype, 1e-4)
    variants = [("as given", solver)] if solver.tol is not None else []
    tightened = with_tolerance(solver, tol)
    if tightened is not None:
        variants.append((f"tol={tol:g}", tightened))
    if not variants:
        raise NotCheckedError(
            f"{solver!r} has no tolerance and dataclasses.replace cannot set one; make it a "
            "dataclass with max_steps and tol fields"
        )
    eps = torch.finfo(problem.dtype).eps
    worst_ratio, claimed_total = 0.0, 0
    for label, variant in variants:
        claimed_tol = float(variant.tol)  # type: ignore[arg-type]
        with torch.no_grad():
            sol = fixed_point(
                problem.f, problem.z0, *problem.args, solver=variant, adjoint=OneStep()
            )
        flag = sol.stats.converged
        require(
            flag is not None,
            f"{variant!r} ({label}) has tol={claimed_tol:g} but reports converged=None (the "
            "flag must be set whenever the solver has a tolerance)",
        )
        assert flag is not None
        require(
            flag.dtype == torch.bool and tuple(flag.shape) == (problem.batch,),
            f"{variant!r} ({label}): stats.converged must be a (B,) = ({problem.batch},) bool "
            f"tensor, got {flag.dtype} {tuple(flag.shape)}",
        )
        stop_mode = str(getattr(variant, "stop_mode", "rel"))
        residual = recomputed_residual(problem, as_tuple(sol.value), stop_mode).cpu()
        allowed = max(HONEST_SLACK * claimed_tol, HONEST_FLOOR_EPS * eps)
        claimed = flag.detach().cpu()
        claimed_total += int(claimed.sum())
        if not bool(claimed.any()):
            continue
        worst = float(residual[claimed].nan_to_num(math.inf).max())
        worst_ratio = max(worst_ratio, worst / claimed_tol)
        bad = claimed & ~(residual <= allowed)  # a NaN residual is not within the tolerance
        sample = int(torch.where(claimed, residual.nan_to_num(math.inf), -1.0).argmax())
        require(
            not bool(bad.any()),
            f"{variant!r} ({label}) reports converged=True after {sol.stats.steps} steps, but "
            f"the residual recomputed at the value it returns (f evaluated once, "
            f"stop_mode={stop_mode!r}) is {worst:.3e} at sample {sample}, "
            f"above its tol={claimed_tol:g} (allowed up to {allowed:.1e}): the converged flag "
            "is dishonest. Set it from the residual of the value the solver returns.",
            recomputed_residual=worst,
            tol=claimed_tol,
            allowed=allowed,
            steps=float(sol.stats.steps),
        )
    return {"worst_residual_over_tol": worst_ratio, "samples_claimed": float(claimed_total)}


def converged_none_without_tolerance(
    problem: Problem, solver: FixedPointSolver
) -> dict[str, float]:
    """Require ``stats.converged is None`` from a solve without a tolerance (the solver as
    given when its ``tol`` is None, else with ``tol=None`` set by ``dataclasses.replace``): a
    fixed budget has nothing to have converged to, and a flag there would be trusted by every
    caller (``GuardedStep``, the failure reports) as if it had been measured."""
    variant = solver
    if solver.tol is not None:
        try:
            variant = dataclasses.replace(solver, tol=None)  # type: ignore[type-var]
        except (TypeError, ValueError) as err:
            raise NotCheckedError(
                f"cannot run {solver!r} without a tolerance (dataclasses.replace: {err}); make "
                "it a dataclass with a tol field"
            ) from err
    with torch.no_grad():
        sol = fixed_point(problem.f, problem.z0, *problem.args, solver=variant, adjoint=OneStep())
    flag = sol.stats.converged
    shown = None if flag is None else f"a {flag.dtype} tensor of shape {tuple(flag.shape)}"
    require(
        flag is None,
        f"{variant!r} has tol=None but reports converged={shown}: the contract says converged "
        "is None without a tolerance (a fixed budget has nothing to converge to); return None",
        steps=float(sol.stats.steps),
    )
    return {"steps": float(sol.stats.steps)}
