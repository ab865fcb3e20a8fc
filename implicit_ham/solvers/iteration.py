"""``FixedPointIteration``: plain, optionally damped, iteration ``z <- f(z)``.

The solver whose steps are plain steps of ``f``: it runs the last ``grad_steps`` of them with
gradient (so ``Unroll`` / ``Truncated`` differentiate the very iterations), the others without.
With ``tol=None`` it runs exactly ``max_steps`` steps with no host synchronisation per step
(Hamburger's K steps), recording the per-step residual trace only when asked (``trace=True``);
with a tolerance it checks the residual each step and, when some steps must carry gradient,
solves without gradient and then redoes the last ``grad_steps`` steps with it
(``_replay_tail``), so the value is the one a fully unrolled solve stops at.
"""


from __future__ import annotations

import dataclasses
import math
from collections import deque
from dataclasses import dataclass

import torch
from torch import Tensor

from implicit_ham._core.state import (
    State,
    StateSpec,
    StepFn,
    detached,
    finite_flags,
)
from implicit_ham._core.stats import SolverStats, TraceRecorder
from implicit_ham._core.transforms import host_checks, under_vmap
from implicit_ham._core.validation import (
    check_budget,
    check_choice,
    check_unit_interval,
)
from implicit_ham.solvers.base import (
    SOLVERS,
    STOP_MODES,
    FixedPointSolver,
    apply_steps,
    damped,
    warn_if_not_converged,
)


@SOLVERS.register("fixed_point")
@dataclass(frozen=True)
class FixedPointIteration(FixedPointSolver):
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
        check_budget("FixedPointIteration", self.max_steps, self.tol)
        check_unit_interval("FixedPointIteration", "damping", self.damping)
        check_choice("FixedPointIteration", "stop_mode", self.stop_mode, STOP_MODES)

    def solve(
        self, f: StepFn, z0: State, spec: StateSpec, grad_steps: int = 0
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

