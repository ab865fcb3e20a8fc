"""``StepwiseSolver``: a plug-in forward solver in three methods, ``init`` / ``step`` /
``terminate``.

The base class owns the loop and everything a solver must get right to be trusted: the residual
of every iterate, measured by the base itself (so ``stats.converged`` is honest whatever the
plug-in does), the budget, the NaN / inf check, the ``ConvergenceWarning`` and the
``SolverStats``. A plug-in writes only its update rule:

* ``init(z0, fz0, spec) -> carry``: the solver's own state (history, momentum, ...) from the
  initial point and its image;
* ``step(z, fz, carry) -> (z_next, carry)``: one iteration from the iterate ``z`` and its image
  ``fz = f(z)`` (both without gradient);
* ``terminate(rel_residual) -> bool`` (optional): stop before the budget; by default when
  every sample's relative residual is ``<= tol``.

Each iteration evaluates ``f`` once, at the new iterate: the returned value is the last iterate,
whose residual ``||f(z) - z||`` was measured at it. The whole batch stops together (a sample's
value can depend on when its batch-mates converge; ``FixedPointIteration`` freezes samples one
by one instead). The solve runs without gradient: backward modes differentiate the solution
themselves (``Unroll``, which needs the solver's own iterates, is refused).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Generic, TypeVar

import torch
from torch import Tensor

from implicit_ham._core.state import State, StateSpec, StepFn, detached, per_sample_norm
from implicit_ham._core.stats import SolverStats
from implicit_ham._core.transforms import host_checks
from implicit_ham.solvers.base import (
    FixedPointSolver,
    raise_non_finite,
    refuse_vmap,
    warn_if_not_converged,
)

C = TypeVar("C")


class StepwiseSolver(FixedPointSolver, Generic[C]):
    """A forward solver written as ``init`` / ``step`` (and optionally ``terminate``); the
    base class runs the loop and measures (see the module's docstring).

    A subclass is a frozen dataclass with the fields ``max_steps`` (at most that many calls of
    ``step``) and ``tol`` (None: exactly ``max_steps`` steps, no host synchronisation per step;
    a float: stop once ``terminate`` says so, one host synchronisation per step).
    """

    max_steps: int
    tol: float | None

    @abstractmethod
    def init(self, z0: State, fz0: State, spec: StateSpec) -> C:
        """The solver's own state before the first step.

        Args:
            z0: the initial iterate (tensors (B, ...) shaped like ``spec``).
            fz0: ``f(z0)``.
            spec: the state's structure (``spec.batch`` is B).
        """

    @abstractmethod
    def step(self, z: State, fz: State, carry: C) -> tuple[State, C]:
        """One iteration: the next iterate (shaped like ``z``) and the new carry, from the
        current iterate ``z`` and its image ``fz = f(z)``."""

    def terminate(self, rel_residual: Tensor) -> bool:
        """Whether to stop, given (B,) ``||f(z) - z|| / ||f(z)||`` of the latest iterate;
        by default when every sample is within ``tol`` (never without a tolerance)."""
        return self.tol is not None and bool((rel_residual <= self.tol).all())

    def solve(self, f: StepFn, z0: State, spec: StateSpec) -> tuple[State, SolverStats]:
        """Run ``step`` from ``z0`` until ``terminate`` or ``max_steps`` steps, without
        gradient; returns the last iterate and its ``SolverStats``."""
        if self.tol is not None:
            refuse_vmap(self)  # stopping on a tolerance decides on values
        with torch.no_grad():
            z = detached(z0)
            fz = f(z)
            residual, rel = _residuals(z, fz)
            first = residual
            carry = self.init(z, fz, spec)
            rows: list[Tensor] = []
            while len(rows) < self.max_steps and not self.terminate(rel):
                z, carry = self.step(z, fz, carry)
                fz = f(z)
                residual, rel = _residuals(z, fz)
                rows.append(residual)
        if host_checks() and not bool(torch.isfinite(residual).all()):
            raise_non_finite(self.name, z0, _first_non_finite([first, *rows]))
        trace = torch.stack(rows) if rows else residual.new_zeros(0, spec.batch)
        converged = None if self.tol is None else rel <= self.tol
        stats = SolverStats(self.name, len(rows), trace, residual, rel, converged)
        warn_if_not_converged(stats, self.tol)
        return z, stats


def _first_non_finite(residuals: list[Tensor]) -> int:
    """The index of the first (B,) residual that is not finite: the forward evaluation, 0 for
    ``f(z0)``, where a NaN / inf appeared (read after the solve, on its error path only)."""
    return next(i for i, r in enumerate(residuals) if not bool(torch.isfinite(r).all()))


def _residuals(z: State, fz: State) -> tuple[Tensor, Tensor]:
    """(B,) ``||f(z) - z||`` and ``||f(z) - z|| / ||f(z)||`` per sample."""
    residual = per_sample_norm(tuple(a - b for a, b in zip(fz, z, strict=True)))
    scale = per_sample_norm(fz)
    return residual, residual / (scale + torch.finfo(scale.dtype).tiny)
