"""The at-fixed-point check of the implicit backward modes (Implicit, Neumann, root layers).

Before an implicit gradient is computed, the worst forward residual is compared with
``FixedPointCheck.tol``; above it ``on_divergence`` decides: "warn" (``NotFixedPointWarning``,
the implicit gradient is still computed), "raise" (``NotFixedPointError``) or "fallback" (warn,
then use the one-step gradient for the batch).
"""

from __future__ import annotations

from dataclasses import dataclass

from implicit_ham._core.errors import NotFixedPointError, NotFixedPointWarning
from implicit_ham._core.events import events

ON_DIVERGENCE = ("warn", "raise", "fallback")


@dataclass(frozen=True)
class FixedPointCheck:
    """How an at-fixed-point backward mode treats a point that is not a fixed point.

    Attributes:
        adjoint: the backward mode's name (for messages and stats).
        tol: the largest accepted relative residual ``||f(z*) - z*|| / ||f(z*)||`` (worst
            sample); None skips the check. For a root (``root_of`` given): the largest accepted
            absolute residual ``||g(z*)||`` (worst sample).
        on_divergence: "warn", "raise" or "fallback" (see the module docstring).
        root_of: None for a fixed point of f; for a root of g, the name of g in messages
            (e.g. "g", "grad_z loss").
    """

    adjoint: str
    tol: float | None
    on_divergence: str
    root_of: str | None = None


def at_fixed_point(worst: float, check: FixedPointCheck, batch: int) -> bool:
    """Apply ``check`` to the worst forward residual: True to go on with the solve, False to
    fall back to the one-step gradient; raises or warns per ``check.on_divergence``."""
    if check.tol is None or worst <= check.tol:
        return True
    if check.root_of is not None:
        return apply_policy(
            check,
            worst,
            f"{check.adjoint} backward: the point it differentiates at is not a root of "
            f"{check.root_of}: ||{check.root_of}(z*)|| = {worst:.3e} (worst of {batch} samples) "
            f"> fixed_point_tol={check.tol:g}. The implicit gradient assumes "
            f"{check.root_of}(z*) = 0 and is wrong here.",
            "Solve further (more steps, a smaller solver tol), differentiate the iterations "
            "instead (Unroll, Truncated, OneStep), raise fixed_point_tol, or set "
            "on_divergence='fallback'.",
        )
    problem = (
        f"{check.adjoint} backward: the point it differentiates at is not a fixed point of f: "
        f"relative residual ||f(z*) - z*|| / ||f(z*)|| = {worst:.3e} (worst of {batch} samples) "
        f"> fixed_point_tol={check.tol:g}. The implicit gradient assumes z* = f(z*) and is "
        "wrong here."
    )
    fix = (
        "Solve further (more steps, a tolerance, Anderson), differentiate the iterations "
        "instead (Unroll, Truncated, OneStep), raise fixed_point_tol, or set "
        "on_divergence='fallback'."
    )
    return apply_policy(check, worst, problem, fix)


def apply_policy(check: FixedPointCheck, worst: float, problem: str, fix: str) -> bool:
    """Raise, or warn and say whether to keep the implicit gradient (False: fall back)."""
    if check.on_divergence == "raise":
        raise NotFixedPointError(f"{problem} {fix}")
    fallback = check.on_divergence == "fallback"
    advice = "Using the one-step gradient for this batch (fallback)." if fallback else fix
    events().warn(
        f"{problem} {advice}",
        NotFixedPointWarning,
        residual=worst,
        where=f"{check.adjoint} backward",
    )
    return not fallback
