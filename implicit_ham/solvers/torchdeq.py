"""torchdeq 0.1.0's Anderson and Broyden, guarded against its known pitfalls (see
docs/solvers.md): plain keyword arguments only, no ``indexing``, the residual recomputed at the
returned point, a singular Anderson system retried with stronger regularisation, and a
non-finite result reported instead of returned. They are the references the native solvers
(``Anderson``, ``Broyden`` in ``solvers``) are tested and benchmarked against, and stay
selectable as "torchdeq_anderson" / "torchdeq_broyden".

torchdeq is an optional extra (``pip install implicit-ham[torchdeq]``): it is imported when one
of these solvers is built, and building one without it raises an ImportError naming the extra.
"""

from __future__ import annotations

import logging
import math
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor

from implicit_ham._core.errors import NonFiniteError
from implicit_ham._core.state import State, StateSpec, StepFn, detached
from implicit_ham._core.stats import SolverStats, TraceRecorder
from implicit_ham.solvers.base import (
    SOLVERS,
    FixedPointSolver,
    refuse_vmap,
    warn_if_not_converged,
)
from implicit_ham.solvers.options import AndersonSolverOptions, BroydenSolverOptions

logger = logging.getLogger(__name__)


def torchdeq_solver(name: str) -> Callable[..., Any]:
    """torchdeq's ``anderson_solver`` / ``broyden_solver``, imported on first use."""
    try:
        from torchdeq import solver
    except ImportError as err:
        raise ImportError(
            f"{name} needs torchdeq, an optional extra: pip install 'implicit-ham[torchdeq]' "
            "(or use the native Anderson / Broyden solvers)"
        ) from err
    return cast(Callable[..., Any], getattr(solver, name))


class _TorchDEQSolver(FixedPointSolver):
    """Shared guard around a torchdeq solver working on flattened (B, N) states.

    The solver spends ``max_steps - 1`` evaluations of ``f``, then evaluates ``f`` once more at
    its solution z* to measure the residual (without gradient: a through-iteration backward
    mode takes its plain steps of ``f`` from the solution itself, and refuses ``Unroll``: the
    accelerated iterations are not differentiable steps).
    """

    max_steps: int
    tol: float | None
    stop_mode: str

    @abstractmethod
    def _run(self, flat_f: Callable[[Tensor], Tensor], x0: Tensor, max_iter: int) -> Tensor:
        """Call the torchdeq solver with plain keyword arguments; return the (B, N) solution."""

    def solve(self, f: StepFn, z0: State, spec: StateSpec) -> tuple[State, SolverStats]:
        refuse_vmap(self)
        budget = self.max_steps - 1
        rec = TraceRecorder(self.name)

        def flat_f(x: Tensor) -> Tensor:
            z = spec.unflatten(x)
            fz = f(z)
            rec.record(z, fz)
            return spec.flatten(fz)

        with torch.no_grad():
            x = self._run(flat_f, spec.flatten(z0), budget)
        z = detached(spec.unflatten(x))
        with torch.no_grad():
            fz = f(z)  # the residual check at z*
        rec.record(z, fz)
        rec.check_finite(z0)
        stats = rec.build(spec.batch, x.device, x.dtype, self.tol, self.stop_mode)
        warn_if_not_converged(stats, self.tol)
        return z, stats

    def _torchdeq_tol(self) -> float:
        return -math.inf if self.tol is None else float(self.tol)


@SOLVERS.register("torchdeq_anderson")
@dataclass(frozen=True)
class TorchDEQAnderson(AndersonSolverOptions, _TorchDEQSolver):
    """Anderson acceleration (torchdeq's ``anderson_solver``), guarded: the reference the
    native ``Anderson`` is tested and benchmarked against.

    Args: as ``Anderson``'s (``AndersonSolverOptions``).

    A singular mixing system (torchdeq has no fallback) or a non-finite result is retried once
    with ``lam`` raised to ``retry_lam``; if that fails too, NonFiniteError is raised. Building
    one without torchdeq raises an ImportError naming the extra.
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        torchdeq_solver("anderson_solver")

    def _run(self, flat_f: Callable[[Tensor], Tensor], x0: Tensor, max_iter: int) -> Tensor:
        return guarded_anderson(
            flat_f,
            x0,
            max_iter=max_iter,
            tol=self._torchdeq_tol(),
            stop_mode=self.stop_mode,
            m=self.m,
            attempts=self.attempts,
            damping=self.damping,
        )


@SOLVERS.register("torchdeq_broyden")
@dataclass(frozen=True)
class TorchDEQBroyden(BroydenSolverOptions, _TorchDEQSolver):
    """Broyden's method (torchdeq's ``broyden_solver``, no line search), guarded: the reference
    the native ``Broyden`` is tested and benchmarked against.

    Args: as ``Broyden``'s (``BroydenSolverOptions``). Building one without torchdeq raises
    an ImportError naming the extra.
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        torchdeq_solver("broyden_solver")

    def _run(self, flat_f: Callable[[Tensor], Tensor], x0: Tensor, max_iter: int) -> Tensor:
        # torchdeq evaluates f once at x0, then once per iteration: max_iter + 1 evaluations.
        x, _, _ = torchdeq_solver("broyden_solver")(
            flat_f,
            x0,
            max_iter=max_iter - 1,
            tol=self._torchdeq_tol(),
            stop_mode=self.stop_mode,
            ls=False,
        )
        if not bool(torch.isfinite(x).all()):
            raise NonFiniteError(
                "Broyden: the solution is non-finite (a degenerate rank-one update); "
                "use Anderson or FixedPointIteration, or a smaller max_steps."
            )
        return x.reshape_as(x0)


def guarded_anderson(
    flat_f: Callable[[Tensor], Tensor],
    x0: Tensor,
    *,
    max_iter: int,
    tol: float,
    stop_mode: str,
    m: int,
    attempts: tuple[float, float],
    damping: float,
) -> Tensor:
    """torchdeq's Anderson on (B, N) vectors, retried once when it fails.

    ``attempts`` are the regularisations of the first solve and of the retry
    (``AndersonOptions.attempts``). Failure means a singular mixing system
    (``torch.linalg.LinAlgError``) or a non-finite result; both come from a (near) rank-deficient
    residual history, e.g. a start at the fixed point with ``lam = 0``.
    """
    retry = attempts[1]
    for attempt, reg in enumerate(attempts):
        try:
            x, _, _ = torchdeq_solver("anderson_solver")(
                flat_f,
                x0,
                max_iter=max_iter,
                tol=tol,
                stop_mode=stop_mode,
                m=m,
                lam=reg,
                tau=damping,
            )
        except torch.linalg.LinAlgError as err:
            failure = f"singular mixing system ({err})"
        else:
            if bool(torch.isfinite(x).all()):
                return x.reshape_as(x0)
            failure = "non-finite result"
        if attempt == 0:
            logger.warning("Anderson: %s with lam=%g; retrying with lam=%g", failure, reg, retry)
    raise NonFiniteError(
        f"Anderson failed twice ({failure}), last with lam={retry:g}; "
        "raise lam/retry_lam or use FixedPointIteration."
    )
