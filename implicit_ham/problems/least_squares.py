"""``least_squares``: the argmin layer of a sum of squares ``½||r(z)||²``, differentiated
through its optimality condition like ``minimize`` (whose ``_solve`` it shares)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor

from implicit_ham.adjoints.modes import Adjoint
from implicit_ham.problems.fixed_point import Solution
from implicit_ham.problems.minimize import _solve
from implicit_ham.solvers.minimizers import Minimizer


def least_squares(
    residuals: Callable[..., Tensor],
    z0: Tensor | Sequence[Tensor],
    *args: Any,
    solver: Minimizer | str | None = None,
    adjoint: Adjoint | str | None = None,
) -> Solution:
    """``z* = argmin_z ½ ||residuals(z, *args)||²``: ``minimize`` of the sum of squares, with
    the least-squares solvers ``GaussNewton`` (default) and ``LevenbergMarquardt`` available.

    Args:
        residuals: ``r(z, *args) -> Tensor`` of any shape (flattened to R entries).
        z0, args, solver, adjoint: as for ``minimize``; the implicit gradient uses the full
            Hessian of ``½||r||²`` (not the Gauss-Newton approximation).
    """

    def loss(z: Any, *a: Any) -> Tensor:
        r = residuals(z, *a)
        return 0.5 * (r * r).sum()

    return _solve(loss, residuals, z0, args, solver, adjoint, None, "least_squares")
