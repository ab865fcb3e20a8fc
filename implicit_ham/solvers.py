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
native (``implicit_ham.accelerated``): they return an evaluated iterate, so its residual is known
without another evaluation of ``f``. torchdeq's solvers, guarded, are in ``torchdeq_solvers``
(``TorchDEQAnderson``, ``TorchDEQBroyden``): the references the native ones are tested and
benchmarked against.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import warnings
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from implicit_ham.accelerated import Iterate, anderson, broyden
from implicit_ham.errors import ConvergenceWarning, NonFiniteError
from implicit_ham.registry import Registry
from implicit_ham.state import State, StateSpec, StepFn, detached, finite_flags, with_gradient_of
from implicit_ham.stats import SolverStats, TraceRecorder
from implicit_ham.transforms import host_checks, under_vmap
from implicit_ham.validation import check_choice, check_positive_int, check_tolerance, check_unit_interval

logger = logging.getLogger(__name__)

SOLVERS: Registry[Solver] = Registry("solver")
STOP_MODES = ("rel", "abs")


class Solver(ABC):
    """A forward fixed-point solver (a small dataclass in every concrete case)."""

    max_steps: int
    tol: float | None

    @abstractmethod
    def solve(
        self,
        f: StepFn,
        z0: State,
        spec: StateSpec,
        grad_steps: int = 0,
    ) -> tuple[State, SolverStats]:
        """Solve ``z = f(z)`` from ``z0``.

        Args:
            f: the map, on tuples of tensors shaped like ``spec``.
            z0: the initial state.
            spec: the state's structure.
            grad_steps: how many trailing iterations carry gradient (clipped to ``max_steps``);
                the returned value must not depend on it (the conformance kit,
                ``implicit_ham.testing.check_solver``, checks this).
        """

    @property
    def name(self) -> str:
        """The registry name of this solver."""
        return SOLVERS.name_of(self) or type(self).__name__


@SOLVERS.register("fixed_point")
@dataclass(frozen=True)
class FixedPointIteration(Solver):
    """Plain (optionally damped) iteration ``z <- damping * f(z) + (1 - damping) * z``.

    Args:
        max_steps: iterations K. With ``tol=None`` exactly K run, without host synchronisation.
        tol: stop once every sample's residual (relative or absolute, see ``stop_mode``) is
            ``<= tol``; this checks the residual on the host each step.
        damping: step size in (0, 1].
        stop_mode: "rel" (``||f(z) - z|| / ||f(z)||``) or "abs".
        check_finite: raise NonFiniteError if an iterate is NaN/inf (one sync per solve).
        trace: record the residual of every step in ``stats.residuals`` (steps, B). Without a
            tolerance and with ``trace=False`` (the default) only the last step's residual is
            measured (``stats.residuals`` is then (1, B), ``stats.steps`` still K), and the
            finiteness check folds each iterate into one running sum (a NaN / inf anywhere
            makes it non-finite); when that sum is non-finite the solve is replayed with the
            trace to name the first non-finite step and tensor. With a tolerance the trace is
            always recorded (the stopping decision needs it).
    """

    max_steps: int = 6
    tol: float | None = None
    damping: float = 1.0
    stop_mode: str = "rel"
    check_finite: bool = True
    trace: bool = False

    def __post_init__(self) -> None:
        check_positive_int("FixedPointIteration", "max_steps", self.max_steps)
        check_tolerance("FixedPointIteration", "tol", self.tol, optional=True)
        check_unit_interval("FixedPointIteration", "damping", self.damping)
        check_choice("FixedPointIteration", "stop_mode", self.stop_mode, STOP_MODES)

    def solve(
        self,
        f: StepFn,
        z0: State,
        spec: StateSpec,
        grad_steps: int = 0,
    ) -> tuple[State, SolverStats]:
        step = damped(f, self.damping)
        grad_steps = min(grad_steps, self.max_steps)
        rec = TraceRecorder(self.name, scale=self.damping)
        if self.tol is not None and under_vmap():
            raise NotImplementedError(
                f"FixedPointIteration(tol={self.tol:g}) under torch.func.vmap: stopping on a "
                "tolerance decides on values, which vmap cannot trace. Use tol=None (a fixed "
                "number of steps) inside vmap."
            )
        if self.tol is None and not self.trace:
            return self._untraced(step, z0, spec, grad_steps, rec)
        if self.tol is None:
            z = self._fixed_budget(step, z0, grad_steps, rec)
        elif grad_steps >= self.max_steps:
            z = self._until_converged(step, z0, rec, keep=0)[0]
        else:
            z = self._replay_tail(step, z0, grad_steps, rec)
        if self.check_finite and host_checks():
            rec.check_finite(z0)
        stats = rec.build(spec.batch, z0[0].device, z0[0].dtype, self.tol, self.stop_mode)
        warn_if_not_converged(stats, self.tol)
        return z, stats

    def _untraced(
        self, step: StepFn, z0: State, spec: StateSpec, grad_steps: int, rec: TraceRecorder
    ) -> tuple[State, SolverStats]:
        """K steps without a per-step trace: the last step's residual, one finiteness sync."""
        check = self.check_finite and host_checks()
        dtype = torch.promote_types(z0[0].dtype, torch.float32)  # fp16 sums would overflow
        health = torch.zeros((), dtype=dtype, device=z0[0].device)
        prev, z = z0, z0
        if grad_steps < self.max_steps:
            with torch.no_grad():
                for _ in range(self.max_steps - grad_steps):
                    prev, z = z, step(z)
                    health = _fold_sums(health, z) if check else health
            z = detached(z)  # no_grad does not stop forward-mode tangents (jvp, jacfwd)
        for _ in range(grad_steps):
            prev, z = z, step(z)
            health = _fold_sums(health, z) if check else health
        rec.record(prev, z)
        if check and not _is_finite(health, z0):
            replay = TraceRecorder(self.name, scale=self.damping)
            with torch.no_grad():
                self._fixed_budget(step, z0, 0, replay)
            replay.check_finite(z0)  # names the first non-finite step and tensor
        stats = rec.build(spec.batch, z0[0].device, z0[0].dtype, None, self.stop_mode)
        return z, dataclasses.replace(stats, steps=self.max_steps)

    def _fixed_budget(self, step: StepFn, z0: State, grad_steps: int, rec: TraceRecorder) -> State:
        z = z0
        if grad_steps < self.max_steps:
            with torch.no_grad():
                for _ in range(self.max_steps - grad_steps):
                    z = _advance(step, z, rec)
            z = detached(z)  # no_grad does not stop forward-mode tangents (jvp, jacfwd)
        for _ in range(grad_steps):
            z = _advance(step, z, rec)
        return z

    def _until_converged(
        self, step: StepFn, z0: State, rec: TraceRecorder, keep: int
    ) -> tuple[State, deque[State]]:
        """Iterate until converged; also return the last ``keep + 1`` iterates (oldest first)."""
        history: deque[State] = deque([z0], maxlen=keep + 1)
        z = z0
        for _ in range(self.max_steps):
            z = _advance(step, z, rec)
            history.append(z)
            metric = (rec.rel if self.stop_mode == "rel" else rec.residuals)[-1]
            worst = float(metric.max())
            if not math.isfinite(worst) or worst <= float(self.tol or 0.0):
                break
        return z, history

    def _replay_tail(self, step: StepFn, z0: State, grad_steps: int, rec: TraceRecorder) -> State:
        """Solve to tolerance without gradient, then redo the last steps with gradient.

        The replay starts from the iterate ``grad_steps`` before the stopping point, so the value
        equals the one a fully unrolled solve with the same tolerance stops at.
        """
        with torch.no_grad():
            z, history = self._until_converged(step, z0, rec, keep=grad_steps)
        if grad_steps == 0:
            return z
        start = history[0] if history[0] is z0 else detached(history[0])
        return apply_steps(step, start, len(history) - 1)


class _NativeSolver(Solver):
    """Shared frame of the native accelerated solvers (``implicit_ham.accelerated``).

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
            _raise_non_finite(self.name, z0, result.failed_at)
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
class Anderson(_NativeSolver):
    """Anderson acceleration (native, ``implicit_ham.accelerated.anderson``); the default
    accelerated solver. ``TorchDEQAnderson`` ("torchdeq_anderson") runs torchdeq's.

    Args:
        max_steps: budget of ``f`` evaluations (see ``_NativeSolver``). tol: stopping
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
class Broyden(_NativeSolver):
    """Broyden's method (native, ``implicit_ham.accelerated.broyden``, no line search).
    ``TorchDEQBroyden`` ("torchdeq_broyden") runs torchdeq's.

    Args:
        max_steps: budget of ``f`` evaluations (see ``_NativeSolver``). tol: stopping
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


def refuse_vmap(solver: Solver) -> None:
    """NotImplementedError under vmap: an accelerated solver decides on values."""
    if under_vmap():
        raise NotImplementedError(
            f"{type(solver).__name__} under torch.func.vmap: its steps decide on values "
            "(convergence checks, the mixing system), which vmap cannot trace. Use "
            "FixedPointIteration(tol=None) inside vmap."
        )


def refuse_unroll(solver: Solver, grad_steps: int) -> None:
    """ValueError when every step would need gradient (Unroll) through an accelerated solver."""
    if grad_steps >= solver.max_steps:
        raise ValueError(
            f"{type(solver).__name__} runs without gradient and cannot be unrolled through all "
            f"{solver.max_steps} steps; use FixedPointIteration with Unroll, or an adjoint with "
            "fewer gradient steps (Truncated, OneStep, Phantom, Implicit, Neumann)."
        )


def _raise_non_finite(solver: str, z0: State, evaluation: int) -> None:
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


def _advance(step: StepFn, z: State, rec: TraceRecorder) -> State:
    z_next = step(z)
    rec.record(z, z_next)
    return z_next


def _fold_sums(health: Tensor, z: State) -> Tensor:
    """``health + sum of every entry of z``: NaN / inf once any iterate held NaN / inf (or,
    rarely, once the sums overflow; the replay then finds nothing and the solve goes on)."""
    with torch.no_grad():
        for t in z:
            health = health + t.detach().sum(dtype=health.dtype)
    return health


def _is_finite(health: Tensor, z0: State) -> bool:
    """One host synchronisation: whether z0 and the folded iterates are finite."""
    flags = torch.cat([finite_flags(tuple(t.detach() for t in z0)), torch.isfinite(health)[None]])
    return bool(flags.all())


def apply_steps(step: StepFn, z: State, n: int) -> State:
    """``n`` steps of ``step`` from ``z``."""
    for _ in range(n):
        z = step(z)
    return z


def warn_if_not_converged(stats: SolverStats, tol: float | None) -> None:
    """``ConvergenceWarning`` with the worst residual when a solve with a tolerance missed it."""
    if tol is None or stats.converged is None or not host_checks() or bool(stats.converged.all()):
        return
    warnings.warn(
        f"{stats.solver}: forward solve did not reach tol={tol:g} in {stats.steps} steps "
        f"(worst relative residual {float(stats.rel_residual.max()):.3e}); raise max_steps "
        "or use Anderson",
        ConvergenceWarning,
        stacklevel=4,
    )
