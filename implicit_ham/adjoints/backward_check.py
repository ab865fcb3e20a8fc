"""The check after an adjoint solve: its true residual, its conditioning, and the policy.

A backward mode (``Implicit``, ``Neumann``) hands the adjoint vector g it computed for the
system ``op`` and the incoming gradient v to ``finish_backward``, which measures the true
residual ``||op.apply(g) - v|| / ||v||`` (``op.apply`` is ``A^T``: ``I - J^T`` for a fixed
point, ``(dg/dz)^T`` for a root), warns when the system is ill-conditioned and applies
``on_divergence`` to a solve that failed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from implicit_ham._core.errors import BackwardSolveError, ConvergenceWarning, NonFiniteError
from implicit_ham._core.events import events
from implicit_ham._core.ill_conditioning import warn_ill_conditioned
from implicit_ham._core.stats import BackwardStats
from implicit_ham._core.transforms import host_checks
from implicit_ham.linalg.operator import AdjointOperator


@dataclass(frozen=True)
class SolvePolicy:
    """What the backward mode asks of its solve.

    Attributes:
        adjoint: the mode's name (messages and stats).
        tol: the largest accepted relative residual; None accepts any finite g.
        on_divergence: "warn", "raise" or "fallback" for a failed solve.
        cond_threshold: κ above which ``ConditioningWarning`` is raised; None: the default.
    """

    adjoint: str
    tol: float | None
    on_divergence: str = "warn"
    cond_threshold: float | None = None


@dataclass(frozen=True)
class SolveRecord:
    """What the linear solve did.

    Attributes:
        linear_solver: its name (stats, messages).
        steps: the operator products it used.
        cond: κ of the system exactly (a dense solve), or None.
        cond_lower_bound: a lower bound of κ (GMRES's Arnoldi matrices), or None.
        cond_label: the system ``cond`` is of, when not ``op``'s (an exact κ of the unscaled
            system after a scaled solve).
        requires_spd: the solver is correct only for a symmetric positive-definite system
            (CG): a failed solve's message then says whether the system is symmetric.
    """

    linear_solver: str
    steps: int
    cond: float | None = None
    cond_lower_bound: float | None = None
    cond_label: str | None = None
    requires_spd: bool = False


@dataclass(frozen=True)
class FinishedBackward:
    """The adjoint vector to use (M,) (the one-step ``v`` after a fallback) and its stats."""

    g: Tensor
    stats: BackwardStats

    def pair(self) -> tuple[Tensor, BackwardStats]:
        """``(g, stats)``, a ``BackwardSolve``'s return value."""
        return self.g, self.stats


def finish_backward(
    op: AdjointOperator, v: Tensor, g: Tensor, policy: SolvePolicy, record: SolveRecord
) -> FinishedBackward:
    """Check the adjoint vector g (M,) of ``op.apply(g) = v`` at its true residual; return it
    (or its fallback) with stats.

    A failed solve is a non-finite g, or (when ``policy.tol`` is given) a residual above it. On
    failure ``policy.on_divergence`` decides: "warn" (``ConvergenceWarning``; a non-finite g
    still raises ``NonFiniteError``), "raise" (``BackwardSolveError`` / ``NonFiniteError``), or
    "fallback" (warn and return the one-step gradient g = v instead, flagged in the stats).
    ``record.cond`` (exact) or else ``record.cond_lower_bound`` above ``policy.cond_threshold``
    warns ``ConditioningWarning`` with the error bound ``κ * residual``.
    """
    if not host_checks():  # under vmap / while compiling values cannot be read: no checks
        return FinishedBackward(g, _stats(policy, record, math.nan, math.nan, None))
    finite = bool(torch.isfinite(g).all())
    v_norm = float(torch.linalg.vector_norm(v.detach()))
    abs_res = _absolute_residual(op, v, g, v_norm, finite)
    rel_res = abs_res / v_norm if v_norm > 0 else abs_res
    tol = policy.tol
    converged = None if tol is None and finite else finite and (tol is None or rel_res <= tol)
    _warn_conditioning(op, policy, record, rel_res if finite else None)
    stats = _stats(policy, record, abs_res, rel_res, converged)
    if converged is not False:
        return FinishedBackward(g, stats)
    return _failed(op, v, FinishedBackward(g, stats), policy, finite, record.requires_spd)


def _stats(
    policy: SolvePolicy,
    record: SolveRecord,
    abs_res: float,
    rel_res: float,
    converged: bool | None,
) -> BackwardStats:
    stats = BackwardStats(
        policy.adjoint, record.linear_solver, record.steps, abs_res, rel_res, converged,
        record.cond,
    )
    return dataclasses.replace(stats, cond_lower_bound=record.cond_lower_bound)


def _absolute_residual(
    op: AdjointOperator, v: Tensor, g: Tensor, v_norm: float, finite: bool
) -> float:
    """``||A^T g - v||``: one more product with the system, on the answer as returned."""
    if v_norm == 0.0 and finite and not bool(g.any()):
        return 0.0  # g = 0 solves the system exactly; J^T 0 may be NaN where J is not finite
    if finite:
        return float(torch.linalg.vector_norm(op.apply(g).detach() - v.detach()))
    return float("inf")


def _warn_conditioning(
    op: AdjointOperator, policy: SolvePolicy, record: SolveRecord, residual: float | None
) -> None:
    """``ConditioningWarning`` when κ (exact first, else its lower bound) passes the
    threshold; ``residual`` (None when g is not finite) gives the error bound ``κ * r``."""
    cond = record.cond
    kappa = cond if cond is not None else record.cond_lower_bound
    if kappa is None:
        return
    label = op.label if cond is None or record.cond_label is None else record.cond_label
    warn_ill_conditioned(
        f"{policy.adjoint} backward", kappa, policy.cond_threshold, record.linear_solver,
        label=label, exact=cond is not None, residual=residual,
    )


def _failed(
    op: AdjointOperator,
    v: Tensor,
    result: FinishedBackward,
    policy: SolvePolicy,
    finite: bool,
    requires_spd: bool,
) -> FinishedBackward:
    """Apply ``policy.on_divergence`` to a failed solve (a solver that needs a symmetric
    system, run on one that is not, gets that named as the cause instead of more steps)."""
    stats, where = result.stats, f"{policy.adjoint} backward"
    rel_res = stats.rel_residual
    problem = _problem(op, v, policy, stats, finite)
    if policy.on_divergence == "fallback":
        events().warn(
            problem + "; using the one-step gradient for this batch (fallback)",
            ConvergenceWarning,
            residual=rel_res if finite else None,
            where=where,
        )
        return FinishedBackward(v.clone(), dataclasses.replace(stats, fallback=True))
    fix = (
        "Raise max_steps, use another linear solver or backward mode, or on_divergence='fallback'."
    )
    if requires_spd and finite:
        fix = _asymmetry_fix(op, v) or fix
    if not finite:
        raise NonFiniteError(f"{problem}; {op.label} is likely singular here. {fix}")
    if policy.on_divergence == "raise":
        raise BackwardSolveError(f"{problem}. {fix}")
    events().warn(
        f"{problem}; the gradient is inaccurate. {fix}",
        ConvergenceWarning,
        residual=rel_res,
        where=where,
    )
    return result


def _asymmetry_fix(op: AdjointOperator, v: Tensor) -> str | None:
    """Why a solver that needs a symmetric system failed, when ``op`` is not symmetric; None
    when it is, up to rounding. The probe (two more products): for ``u = v / ||v||``,
    ``u . A(Au) = (A^T u) . (Au)``, which equals ``||Au||^2`` when ``A^T = A``; the difference
    is measured against ``||A(Au)||`` (the dot product's own scale) and accepted below the
    square root of the dtype's machine epsilon. The system of a fixed point, ``I - J^T``, is
    symmetric only where ``f`` is a gradient step."""
    u = v.detach() / torch.linalg.vector_norm(v.detach())
    au = op.apply(u).detach()
    a2u = op.apply(au).detach()
    along, square = float(torch.dot(u, a2u)), float(torch.dot(au, au))
    scale = float(torch.linalg.vector_norm(a2u))
    if not scale > 0 or abs(along - square) <= math.sqrt(torch.finfo(v.dtype).eps) * scale:
        return None
    return (
        f"The solver needs a symmetric positive-definite system and {op.label} is not "
        f"symmetric here (u . A(Au) = {along:.3e} vs ||Au||^2 = {square:.3e}, u the normalised "
        "right-hand side): more steps will not help. Use linear_solver='gmres' or 'auto' (CG "
        "suits the system of a minimum: minimize, least_squares, a gradient-step map), or "
        "on_divergence='fallback'."
    )


def _problem(
    op: AdjointOperator, v: Tensor, policy: SolvePolicy, stats: BackwardStats, finite: bool
) -> str:
    """What went wrong, with the numbers (residual or non-finiteness, κ)."""
    steps, cond, bound = stats.steps, stats.cond, stats.cond_lower_bound
    return (
        f"{policy.adjoint} backward: {stats.linear_solver} "
        + (
            f"did not reach tol={policy.tol:g} in {steps} VJPs (relative residual "
            f"{stats.rel_residual:.3e}"
            if finite
            else f"returned a non-finite adjoint after {steps} VJPs (incoming gradient "
            f"{'finite' if bool(torch.isfinite(v).all()) else 'already non-finite'}"
        )
        + (f", κ({op.label}) = {cond:.3e}" if cond is not None else "")
        + (f", κ({op.label}) >= {bound:.3e}" if bound is not None else "")
        + ")"
    )
