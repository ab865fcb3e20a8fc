"""Forward solvers: find z* = f(z*) from z0.

Every solver shares one signature, ``solve(f, z0, spec)``, and returns the final state and a
``SolverStats``. A solver only finds z*: how the solution is differentiated is the backward
mode's business (``implicit_ham.adjoints``), so the value cannot depend on the backward mode. A
through-iteration mode (``Unroll``, ``Truncated``, ``OneStep``) differentiates trailing plain
steps of ``f``: it takes them itself from the solver's solution (``with_gradient_of``, value
unchanged), unless the solver declares the capability ``ReplaysIterates`` (as
``FixedPointIteration`` does, whose steps are plain steps of ``f``): such a solver runs its own
last ``grad_steps`` iterations with gradient (``solve_replaying``).

This module holds the base class ``FixedPointSolver``, the capability ``ReplaysIterates``, the
registry (``make_solver`` / ``register_solver``) and the pieces the solvers share (the vmap
refusal, the non-finite error, damping, the convergence warning, the residual trace of the root
/ argmin solvers). The solvers are ``FixedPointIteration`` (``solvers.iteration``), the native
``Anderson`` / ``Broyden`` (``solvers.accelerated``) and torchdeq's, guarded
(``solvers.torchdeq``, optional).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import Tensor

from implicit_ham._core.errors import ConvergenceWarning, NonFiniteError
from implicit_ham._core.events import events
from implicit_ham._core.registry import Registry
from implicit_ham._core.state import (
    State,
    StateSpec,
    StepFn,
    finite_flags,
    per_sample_norm,
)
from implicit_ham._core.stats import SolverStats
from implicit_ham._core.transforms import host_checks, under_vmap

SOLVERS: Registry[FixedPointSolver] = Registry("solver")
make_solver = SOLVERS.make_function("make_solver", __name__)
register_solver = SOLVERS.register_function("register_solver", __name__)


STOP_MODES = ("rel", "abs")


class FixedPointSolver(ABC):
    """A forward fixed-point solver (a small dataclass in every concrete case)."""

    max_steps: int
    tol: float | None

    @abstractmethod
    def solve(self, f: StepFn, z0: State, spec: StateSpec) -> tuple[State, SolverStats]:
        """Solve ``z = f(z)`` from ``z0``.

        Args:
            f: the map, on tuples of tensors shaped like ``spec``.
            z0: the initial state.
            spec: the state's structure.
        """

    @property
    def name(self) -> str:
        """The registry name of this solver."""
        return SOLVERS.name_of(self) or type(self).__name__


class ReplaysIterates(ABC):
    """The capability of a solver whose steps are plain steps of ``f``: it can run its own last
    ``grad_steps`` iterations with gradient, so that ``Unroll`` / ``Truncated`` / ``OneStep``
    differentiate the very iterations it took (``FixedPointIteration``). A solver without it
    is differentiated through ``grad_steps`` plain steps of ``f`` taken from its solution, and
    refuses ``Unroll``."""

    @abstractmethod
    def solve_replaying(
        self, f: StepFn, z0: State, spec: StateSpec, grad_steps: int
    ) -> tuple[State, SolverStats]:
        """``solve(f, z0, spec)`` with the last ``grad_steps`` iterations (clipped to
        ``max_steps``) carrying gradient; the returned value must not depend on
        ``grad_steps`` (the conformance kit, ``implicit_ham.testing.check_solver``, checks
        this)."""


def refuse_vmap(solver: FixedPointSolver) -> None:
    """NotImplementedError under vmap: an accelerated solver decides on values."""
    if under_vmap():
        raise NotImplementedError(
            f"{type(solver).__name__} under torch.func.vmap: its steps decide on values "
            "(convergence checks, the mixing system), which vmap cannot trace. Use "
            "FixedPointIteration(tol=None) inside vmap."
        )


def raise_non_finite(solver: str, z0: State, evaluation: int) -> None:
    flags = finite_flags(tuple(t.detach() for t in z0)).tolist()
    if not all(flags):
        where = f"state[{flags.index(False)}] at the initial state z0"
    else:
        where = f"forward evaluation {evaluation + 1} (after a retry where the solver has one)"
    raise NonFiniteError(
        f"{solver}: non-finite value (NaN or inf, or a step whose size overflows) at {where}. "
        "Check f for overflow or division by zero, use FixedPointIteration, or float64."
    )


def damped(f: StepFn, weight: float) -> StepFn:
    """The map ``z -> weight * f(z) + (1 - weight) * z`` (``f`` itself for weight 1)."""
    if weight == 1.0:
        return f
    return lambda z: tuple(weight * fz + (1 - weight) * zi for fz, zi in zip(f(z), z, strict=True))


def apply_steps(step: StepFn, z: State, n: int) -> State:
    """``n`` steps of ``step`` from ``z``."""
    for _ in range(n):
        z = step(z)
    return z


def warn_if_not_converged(stats: SolverStats, tol: float | None) -> None:
    """``ConvergenceWarning`` with the worst residual when a solve with a tolerance missed it."""
    if tol is None or stats.converged is None or not host_checks() or bool(stats.converged.all()):
        return
    worst = float(stats.rel_residual.max())
    events().warn(
        f"{stats.solver}: forward solve did not reach tol={tol:g} in {stats.steps} steps "
        f"(worst relative residual {worst:.3e}); {_advice(stats)}",
        ConvergenceWarning,
        residual=worst,
        where=stats.solver,
    )


def _advice(stats: SolverStats) -> str:
    """What to try after a missed tolerance: from the residual trace when it did not shrink
    (a map that is not contractive there), else more steps or another solver than this one."""
    trace = stats.residuals
    if trace.shape[0] >= 2:
        first, last = float(trace[0].max()), float(trace[-1].max())
        if not last < first:
            return (
                f"the residual did not shrink over the solve ({first:.3e} -> {last:.3e}): f may "
                "not be contractive there; damp the iteration or constrain f's weights "
                "(ih.nn.apply_norm)"
            )
    if "anderson" in stats.solver or "broyden" in stats.solver:
        return "raise max_steps, or try the other accelerated solver (Anderson / Broyden)"
    return "raise max_steps, or use an accelerated solver (Anderson, Broyden)"


@dataclass
class ResidualTrace:
    """Per-sample ``||g(z_k)||`` of a root / argmin solve (the rows of ``SolverStats``)."""

    solver: str
    rows: list[Tensor] | None = None
    first: Tensor | None = None

    def start(self, spec: StateSpec, flat_residual: Tensor) -> None:
        """The residual at z0 (not a step; the reference of ``rel_residual``)."""
        self.rows, self.first = [], self._norms(spec, flat_residual)
        self._check(self.first, 0)

    def record(self, spec: StateSpec, flat_residual: Tensor) -> None:
        """The residual after one more step."""
        assert self.rows is not None
        self.rows.append(self._norms(spec, flat_residual))
        self._check(self.rows[-1], len(self.rows))

    def done(self, tol: float | None) -> bool:
        """Whether every sample's latest residual is ``<= tol``."""
        last = self.rows[-1] if self.rows else self.first
        return tol is not None and last is not None and bool((last <= tol).all())

    def build(self, tol: float | None) -> SolverStats:
        """The ``SolverStats``; warns ``ConvergenceWarning`` when ``tol`` was missed."""
        assert self.rows is not None and self.first is not None
        last = self.rows[-1] if self.rows else self.first
        trace = torch.stack(self.rows) if self.rows else self.first.new_zeros(0, len(last))
        rel = last / (self.first + torch.finfo(last.dtype).tiny)
        converged = None if tol is None else last <= tol
        stats = SolverStats(self.solver, len(self.rows), trace, last, rel, converged)
        if converged is not None and host_checks() and not bool(converged.all()):
            worst = float(last.max())
            events().warn(
                f"{self.solver}: did not reach tol={tol:g} in {stats.steps} steps (worst "
                f"residual {worst:.3e}); raise max_steps or change the solver",
                ConvergenceWarning,
                residual=worst,
                where=self.solver,
            )
        return stats

    @staticmethod
    def _norms(spec: StateSpec, flat_residual: Tensor) -> Tensor:
        return per_sample_norm((flat_residual.detach().reshape(spec.batch, -1),))

    def _check(self, norms: Tensor, step: int) -> None:
        if host_checks() and not bool(torch.isfinite(norms).all()):
            where = "the initial state z0" if step == 0 else f"step {step}"
            raise NonFiniteError(
                f"{self.solver}: non-finite residual (NaN or inf) at {where}. Check the "
                "problem for overflow, damp the steps, or use float64."
            )
