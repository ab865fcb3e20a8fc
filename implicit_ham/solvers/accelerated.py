"""Forward solvers: find z* = f(z*) from z0, spending the last ``grad_steps`` steps with gradient.

Every solver shares one signature, ``solve(f, z0, spec, grad_steps)``, and returns the final
state and a ``SolverStats``. The solver alone defines its iteration: the backward mode only says
how many trailing iterations carry gradient (all of them for ``Unroll``, the last k for
``Truncated(k)``, none for ``Implicit``), so the value cannot depend on the backward mode.
``FixedPointIteration`` runs those steps with gradient; a solver whose steps are not plain steps
of ``f`` (Anderson, Broyden) solves without gradient and attaches the gradient of ``grad_steps``
plain steps of ``f`` taken from its solution, without changing the value (``with_gradient_of``).

``FixedPointIteration`` with ``tol=None`` runs exactly ``max_steps`` steps with no host
synchronisation per step (Hamburger's K steps); its per-step residual trace is recorded only
when asked for (``trace=True``) or when a tolerance needs it. ``Anderson`` and ``Broyden`` are
native (``implicit_ham.linalg.acceleration``): they return an evaluated iterate, so its residual is
known
without another evaluation of ``f``. torchdeq's solvers, guarded, are in ``torchdeq_solvers``
(``TorchDEQAnderson``, ``TorchDEQBroyden``): the references the native ones are tested and
benchmarked against.
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from implicit_ham._core.state import (
    State,
    StateSpec,
    StepFn,
    detached,
    with_gradient_of,
)
from implicit_ham._core.stats import SolverStats
from implicit_ham._core.validation import (
    check_choice,
    check_positive_int,
    check_tolerance,
    check_unit_interval,
)
from implicit_ham.linalg.acceleration import Iterate, anderson, broyden
from implicit_ham.solvers.base import (
    SOLVERS,
    STOP_MODES,
    FixedPointSolver,
    apply_steps,
    raise_non_finite,
    refuse_unroll,
    refuse_vmap,
    warn_if_not_converged,
)

logger = logging.getLogger(__name__)


class NativeSolver(FixedPointSolver):
    """Shared frame of the native accelerated solvers (``implicit_ham.linalg.acceleration``).

    The solve spends at most ``max_steps - 1`` evaluations of ``f`` without gradient and
    returns, per sample, the evaluated iterate with the lowest residual; its residual is
    therefore known without another evaluation. Under a through-iteration backward mode
    (``grad_steps >= 1`` with gradient enabled) ``f`` is evaluated once more at the solution
    z* with gradient (the ``max_steps``-th evaluation, the first gradient step), followed by
    ``grad_steps - 1`` more plain steps; the result carries their gradient and z*'s value
    (``with_gradient_of``), so the value is the same under every backward mode. ``Unroll``
    (``grad_steps >= max_steps``) is refused. Host synchronisations: one per evaluation with a
    tolerance (the stopping decision, which also detects NaN / inf), one per solve without.
    """

    max_steps: int
    tol: float | None
    stop_mode: str

    @abstractmethod
    def _iterate(self, flat_f: Callable[[Tensor], Tensor], x0: Tensor, budget: int) -> Iterate:
        """Run the native solver on (B, N) states."""

    def solve(
        self,
        f: StepFn,
        z0: State,
        spec: StateSpec,
        grad_steps: int = 0,
    ) -> tuple[State, SolverStats]:
        refuse_vmap(self)
        refuse_unroll(self, grad_steps)
        flat = _Flat(spec)

        def flat_f(x: Tensor) -> Tensor:
            return flat.flatten(f(flat.unflatten(x)))

        with torch.no_grad():
            result = self._iterate(flat_f, flat.flatten(z0), self.max_steps - 1)
        if result.failed_at is not None:
            raise_non_finite(self.name, z0, result.failed_at)
        z = detached(flat.unflatten(result.x))
        if grad_steps > 0 and torch.is_grad_enabled():
            z = with_gradient_of(z, apply_steps(f, f(z), grad_steps - 1))
        converged = None
        if self.tol is not None:
            metric = result.rel_residual if self.stop_mode == "rel" else result.abs_residual
            converged = metric <= self.tol
        stats = SolverStats(
            self.name,
            result.evaluations,
            result.residuals,
            result.abs_residual,
            result.rel_residual,
            converged,
        )
        warn_if_not_converged(stats, self.tol)
        return z, stats


@SOLVERS.register("anderson")
@dataclass(frozen=True)
class Anderson(NativeSolver):
    """Anderson acceleration (native, ``implicit_ham.linalg.acceleration.anderson``); the default
    accelerated solver. ``TorchDEQAnderson`` ("torchdeq_anderson") runs torchdeq's.

    Args:
        max_steps: budget of ``f`` evaluations (see ``NativeSolver``). tol: stopping
            tolerance (None: use the budget).
        m: history size (>= 2). lam: Tikhonov regularisation of the mixing system.
        damping: mixing step size in (0, 1]. stop_mode: "rel" or "abs".

    A singular mixing system or a non-finite iterate is retried once with ``lam`` raised to
    ``retry_lam``; if that fails too, NonFiniteError is raised.
    """

    max_steps: int = 50
    tol: float | None = 1e-5
    m: int = 5
    lam: float = 1e-4
    damping: float = 1.0
    stop_mode: str = "rel"
    retry_lam: float = 1e-2

    def __post_init__(self) -> None:
        check_anderson_options(type(self).__name__, self)

    def _iterate(self, flat_f: Callable[[Tensor], Tensor], x0: Tensor, budget: int) -> Iterate:
        retry = max(self.retry_lam, self.lam)
        for attempt, lam in enumerate((self.lam, retry)):
            result = anderson(
                flat_f,
                x0,
                max_evals=budget,
                tol=self.tol,
                stop_mode=self.stop_mode,
                m=self.m,
                lam=lam,
                damping=self.damping,
            )
            if result.failed_at is None or result.failed_at == 0:
                return result
            if attempt == 0:
                logger.warning(
                    "Anderson: non-finite iterate at evaluation %d with lam=%g; retrying with "
                    "lam=%g",
                    result.failed_at + 1,
                    lam,
                    retry,
                )
        return result


@SOLVERS.register("broyden")
@dataclass(frozen=True)
class Broyden(NativeSolver):
    """Broyden's method (native, ``implicit_ham.linalg.acceleration.broyden``, no line search).
    ``TorchDEQBroyden`` ("torchdeq_broyden") runs torchdeq's.

    Args:
        max_steps: budget of ``f`` evaluations (see ``NativeSolver``). tol: stopping
            tolerance (None: use the budget). stop_mode: "rel" or "abs".
    """

    max_steps: int = 50
    tol: float | None = 1e-5
    stop_mode: str = "rel"

    def __post_init__(self) -> None:
        check_broyden_options(type(self).__name__, self)

    def _iterate(self, flat_f: Callable[[Tensor], Tensor], x0: Tensor, budget: int) -> Iterate:
        return broyden(flat_f, x0, max_evals=budget, tol=self.tol, stop_mode=self.stop_mode)


class _Flat:
    """(B, N) views of a state: a reshape (no copy) for a one-tensor state, a concatenation
    otherwise."""

    def __init__(self, spec: StateSpec) -> None:
        self.spec = spec
        self.single = len(spec.shapes) == 1

    def flatten(self, z: State) -> Tensor:
        return z[0].reshape(self.spec.batch, -1) if self.single else self.spec.flatten(z)

    def unflatten(self, x: Tensor) -> State:
        return (x.reshape(self.spec.shapes[0]),) if self.single else self.spec.unflatten(x)


def check_anderson_options(owner: str, solver: Any) -> None:
    """Validate an Anderson-type solver's fields (shared by the native and torchdeq ones)."""
    check_positive_int(owner, "max_steps", solver.max_steps, minimum=4)
    check_tolerance(owner, "tol", solver.tol, optional=True)
    check_positive_int(owner, "m", solver.m, minimum=2)
    check_unit_interval(owner, "damping", solver.damping)
    check_choice(owner, "stop_mode", solver.stop_mode, STOP_MODES)
    if solver.lam < 0:
        raise ValueError(f"{owner}: lam must be >= 0, got {solver.lam!r}")


def check_broyden_options(owner: str, solver: Any) -> None:
    """Validate a Broyden-type solver's fields (shared by the native and torchdeq ones)."""
    check_positive_int(owner, "max_steps", solver.max_steps, minimum=3)
    check_tolerance(owner, "tol", solver.tol, optional=True)
    check_choice(owner, "stop_mode", solver.stop_mode, STOP_MODES)

