"""``FixedPointIteration``: plain, optionally damped, iteration ``z <- f(z)``.

The solver whose steps are plain steps of ``f``: it declares ``ReplaysIterates``, so under a
through-iteration backward mode it runs the last ``grad_steps`` of them with gradient
(``solve_replaying``; ``Unroll`` / ``Truncated`` differentiate the very iterations), the others
without.
With ``tol=None`` it runs exactly ``max_steps`` steps with no host synchronisation per step
(Hamburger's K steps), recording the per-step residual trace only when asked (``trace=True``);
with a tolerance it checks the residual each step (one host synchronisation) and stops each
sample on its own: a sample whose residual is ``<= tol`` is frozen (no further update) while the
others go on, so a sample's value and step count do not depend on its batch-mates (given an
``f`` that treats samples independently). When some steps must carry gradient it solves
without gradient and then redoes each sample's last ``grad_steps`` steps with it
(``_replay_tail``), so the value is the one a fully unrolled solve stops at.
"""

from __future__ import annotations

import math
import warnings
from collections import deque
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.autograd import forward_ad

from implicit_ham._core.caller import user_stacklevel
from implicit_ham._core.errors import BatchCouplingWarning, NonFiniteError
from implicit_ham._core.state import (
    State,
    StateSpec,
    StepFn,
    detached,
    with_gradient_of,
)
from implicit_ham._core.stats import SolverStats, TraceRecorder
from implicit_ham._core.transforms import active_transforms, host_checks, under_vmap
from implicit_ham._core.validation import (
    check_budget,
    check_choice,
    check_unit_interval,
)
from implicit_ham.solvers.base import (
    SOLVERS,
    STOP_MODES,
    FixedPointSolver,
    ReplaysIterates,
    apply_steps,
    damped,
    warn_if_not_converged,
)

DEFAULT_STEPS = 6  # FixedPointIteration's budget without a tolerance (Hamburger's K)
DEFAULT_TOL_STEPS = 100  # its budget with a tolerance


@SOLVERS.register("fixed_point")
@dataclass(frozen=True)
class FixedPointIteration(FixedPointSolver, ReplaysIterates):
    """Plain (optionally damped) iteration ``z <- damping * f(z) + (1 - damping) * z``.

    Args:
        max_steps: iterations K. With ``tol=None`` exactly K run, without host synchronisation;
            with a tolerance at most K. 0 (the default): ``DEFAULT_STEPS`` (6, Hamburger's K)
            without a tolerance, ``DEFAULT_TOL_STEPS`` (100) with one, so that
            ``FixedPointIteration(tol=1e-6)`` runs to its tolerance rather than stopping at 6
            with a ConvergenceWarning. The resolved number is what the instance holds.
        tol: stop a sample once its residual (relative or absolute, see ``stop_mode``) is
            ``<= tol`` (it is then frozen while the others go on; ``stats.sample_steps`` holds
            each sample's count) and the solve once every sample is; this checks the residual
            on the host each step.
        damping: step size in (0, 1].
        stop_mode: "rel" (``||f(z) - z|| / ||f(z)||``) or "abs".
        check_finite: raise NonFiniteError if the solve went NaN / inf (one sync per solve).
        trace: record the residual of every step in ``stats.residuals`` (steps, B). Without a
            tolerance and with ``trace=False`` (the default) only the last step's residual is
            measured (``stats.residuals`` is then (1, B), ``stats.steps`` still K), and the
            finiteness check looks at z0 and the last step (the final state and its change)
            once per solve; when they are not finite the solve is replayed with the trace to
            name the first non-finite step and tensor. A NaN / inf that ``f`` itself maps back
            to finite values before the last step is therefore not reported on this path (it
            is with ``trace=True`` or a tolerance, which check every step's change). With a
            tolerance the trace is always recorded (the stopping decision needs it).
    """

    max_steps: int = 0
    tol: float | None = None
    damping: float = 1.0
    stop_mode: str = "rel"
    check_finite: bool = True
    trace: bool = False

    def __post_init__(self) -> None:
        if self.max_steps == 0 and not isinstance(self.max_steps, bool):
            steps = DEFAULT_STEPS if self.tol is None else DEFAULT_TOL_STEPS
            object.__setattr__(self, "max_steps", steps)
        check_budget("FixedPointIteration", self.max_steps, self.tol)
        check_unit_interval("FixedPointIteration", "damping", self.damping)
        check_choice("FixedPointIteration", "stop_mode", self.stop_mode, STOP_MODES)

    def solve(self, f: StepFn, z0: State, spec: StateSpec) -> tuple[State, SolverStats]:
        """Iterate from ``z0``, every step without gradient (``solve_replaying`` with none)."""
        return self.solve_replaying(f, z0, spec, 0)

    def solve_replaying(
        self, f: StepFn, z0: State, spec: StateSpec, grad_steps: int
    ) -> tuple[State, SolverStats]:
        """``solve`` with the last ``grad_steps`` iterations carrying gradient (see the
        module's docstring for how a tolerance solve replays them)."""
        step = damped(f, self.damping)
        recording, checks, stats_now = _environment()
        grad_steps = min(grad_steps, self.max_steps) if recording else 0
        rec = TraceRecorder(self.name, scale=self.damping)
        if self.tol is not None and not checks and under_vmap():
            raise NotImplementedError(
                f"FixedPointIteration(tol={self.tol:g}) under torch.func.vmap: stopping on a "
                "tolerance decides on values, which vmap cannot trace. Use tol=None (a fixed "
                "number of steps) inside vmap: solver=FixedPointIteration(max_steps=K) "
                "(ih.fixed_point's default solver has a tolerance)."
            )
        if self.tol is None and not self.trace:
            return self._untraced(step, z0, spec, grad_steps, rec, (recording, checks, stats_now))
        stops: _Stops | None = None
        if self.tol is None:
            z = self._fixed_budget(step, z0, grad_steps, rec)
        elif grad_steps >= self.max_steps:
            z, stops = self._until_converged(step, z0, rec, keep=0)
            rec.sample_steps = stops.per_sample
            if checks:
                _warn_if_frozen_drift(self.name, rec, stops)
        else:
            z, stops = self._replay_tail(step, z0, grad_steps, rec)
        # a tolerance loop has read every step's metric, which is finite only for finite steps
        if self.check_finite and checks and not (stops is not None and stops.finite):
            rec.check_finite(z0)
        stats = rec.build(
            spec.batch, z0[0].device, z0[0].dtype, self.tol, self.stop_mode, now=stats_now
        )
        if stops is None or not stops.converged:
            warn_if_not_converged(stats, self.tol)
        return z, stats

    def _untraced(
        self,
        step: StepFn,
        z0: State,
        spec: StateSpec,
        grad_steps: int,
        rec: TraceRecorder,
        environment: tuple[bool, bool, bool],
    ) -> tuple[State, SolverStats]:
        """K steps without a per-step trace: the last step's residual, one finiteness sync.
        ``environment``: ``_environment()`` as ``solve`` read it (without recording no step can
        carry a graph or a tangent, so the state needs no detaching)."""
        recording, checks, stats_now = environment
        # ``prev = z`` before each step (not ``prev, z = z, step(z)``): the iterate two steps
        # back is released before the step allocates the next one (two states alive, not three)
        prev = z = z0
        if grad_steps < self.max_steps:
            with torch.no_grad() if torch.is_grad_enabled() else nullcontext():
                for _ in range(self.max_steps - grad_steps):
                    prev = z
                    z = step(z)
            if recording:
                z = detached(z)  # no_grad does not stop forward-mode tangents (jvp, jacfwd)
        for _ in range(grad_steps):
            prev = z
            z = step(z)
        rec.record(prev, z)
        if self.check_finite and checks and not rec.last_step_finite():
            replay = TraceRecorder(self.name, scale=self.damping)
            with torch.no_grad():
                self._fixed_budget(step, z0, 0, replay)
            replay.check_finite(z0)  # names the first non-finite step and tensor
            raise NonFiniteError(
                f"{self.name}: non-finite value (NaN or inf, or a step whose size overflows) in "
                f"the final state after {self.max_steps} steps (the replay without gradient "
                "stayed finite: f differs between grad and no-grad mode). Check f for overflow "
                "or division by zero, or use float64."
            )
        device, dtype = z0[0].device, z0[0].dtype
        return z, rec.build(
            spec.batch, device, dtype, None, self.stop_mode, self.max_steps, now=stats_now
        )

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
    ) -> tuple[State, _Stops]:
        """Iterate until every sample is converged, freezing each one as it converges.

        Returns the final state and the per-sample stops: each sample's step count and, when
        ``keep > 0``, the iterate ``keep`` steps before its stop (z0 where it stopped sooner).
        One host synchronisation per step (``_bounds``): the (min, max) of the stopping metric
        over the samples still running (NaN / inf stops the solve; the finite check then names it).
        The metric is ``TraceRecorder.excess`` (``<= 0`` where a sample meets the tolerance).
        """
        tol = float(self.tol or 0.0)
        running = _Running(z0[0].shape[0], z0[0].device)
        window: deque[State] = deque([z0], maxlen=keep + 1)
        starts: State | None = None  # per sample: the iterate keep steps before its stop
        z, high = z0, math.inf
        for k in range(1, self.max_steps + 1):
            z_next = step(z)
            rec.record(z, z_next)
            z = z_next if running.mask is None else _select(running.mask, z_next, z)
            if keep:
                window.append(z)
            excess = rec.excess(tol, self.stop_mode)
            high, some_met = running.read(excess)
            if not math.isfinite(high) or high <= 0:
                break
            if some_met:  # some samples converged at step k: freeze them
                done = running.freeze(excess, k)
                if keep:
                    starts = _select(done, window[0], z0 if starts is None else starts)
        if keep:
            running_start = window[0]
            starts = (
                running_start
                if starts is None or running.mask is None
                else _select(running.mask, running_start, starts)
            )
        finite = math.isfinite(high)
        stops = running.stops(k)
        return z, _Stops(stops, k, starts, stops is not None, finite, finite and high <= 0)

    def _replay_tail(
        self, step: StepFn, z0: State, grad_steps: int, rec: TraceRecorder
    ) -> tuple[State, _Stops]:
        """Solve to tolerance without gradient, then redo each sample's last steps with gradient.

        Each sample's replay starts from its own iterate ``grad_steps`` before its stop; a
        sample that stopped after fewer steps replays only those (masked). For an ``f`` that
        treats the samples independently the replay reproduces the solve's value exactly; when
        the samples stopped at different steps the value returned is the solve's in any case
        (the replay carries the gradient only), so it is the same under every backward mode,
        and a replay that does not reproduce it (an ``f`` that couples the samples) warns
        ``BatchCouplingWarning`` with the difference.
        """
        with torch.no_grad():
            solved, stops = self._until_converged(step, z0, rec, keep=grad_steps)
        rec.sample_steps = stops.per_sample
        if grad_steps == 0:
            if host_checks():
                _warn_if_frozen_drift(self.name, rec, stops)
            return solved, stops
        assert stops.starts is not None
        start = stops.starts
        counts = [stops.last] if stops.per_sample is None else stops.per_sample.tolist()
        if min(counts) >= grad_steps:
            z = apply_steps(step, start if start is z0 else detached(start), grad_steps)
        else:
            at_z0 = torch.tensor([c <= grad_steps for c in counts], device=z0[0].device)
            z = _select(at_z0, z0, detached(start))  # keeps z0's graph where a replay starts there
            for j in range(grad_steps):
                live = torch.tensor([c + j >= grad_steps for c in counts], device=z0[0].device)
                z = _select(live, step(z), z)
        if not stops.staggered:
            return z, stops
        if host_checks():
            _warn_if_coupled(self.name, solved, z, counts)
            _warn_if_frozen_drift(self.name, rec, stops)
        return with_gradient_of(solved, z), stops


class _Running:
    """Which samples a tolerance solve still iterates, and the step each frozen one stopped at.

    ``read`` takes a step's stopping metric (``TraceRecorder.excess``, ``<= 0`` where a sample
    meets the tolerance) with one host synchronisation. A batch of at most ``_HOST_REDUCE``
    samples is copied whole and decided in Python, its stops kept on the host (no reduction
    kernel per step, and a freeze costs three mask kernels: on the CPU each costs more than
    the copy); a larger one is reduced on its device (the (min, max) pair, or the max over
    the running samples, copied once).
    """

    def __init__(self, batch: int, device: torch.device) -> None:
        self.on_host, self.device = batch <= _HOST_REDUCE, device
        self.mask: Tensor | None = None  # (B,) bool, still running; None while all are
        self._values: list[float] = []  # the last metric read (small batches)
        self._running: list[bool] = [True] * batch if self.on_host else []
        self._host_stops: list[int] | None = None  # each frozen sample's step (small batches)
        self._stops: Tensor | None = None  # the same on the device (large batches)

    def read(self, excess: Tensor) -> tuple[float, bool]:
        """The worst metric over the running samples (NaN where one is NaN / inf), and whether
        some running sample may have met the tolerance (then ``freeze`` if the solve goes on)."""
        if self.on_host:
            self._values = values = excess.tolist()
            live = (  # until a sample freezes every one runs: no filtering pass
                values
                if self.mask is None
                else [v for v, a in zip(values, self._running, strict=True) if a]
            )
            # the sum is finite exactly when every value is, unless finite values overflow it
            finite = math.isfinite(sum(live)) or all(map(math.isfinite, live))
            high = max(live) if finite else math.nan
            return high, min(live) <= 0
        if self.mask is None:
            low, high = _bounds(excess)
            return high, low <= 0
        return excess.masked_fill(~self.mask, 0.0).max().item(), True

    def freeze(self, excess: Tensor, step: int) -> Tensor:
        """Stop the running samples whose ``excess`` (the metric ``read`` took) is ``<= 0`` at
        ``step``; return their (B,) mask."""
        met = excess <= 0
        done = met if self.mask is None else self.mask & met
        self.mask = ~met if self.mask is None else self.mask ^ done
        if not self.on_host:
            stops = (
                torch.zeros_like(done, dtype=torch.int64) if self._stops is None else self._stops
            )
            self._stops = stops.masked_fill(done, step)
            return done
        steps = self._host_stops or [0] * len(self._values)
        flags = [a and v <= 0 for v, a in zip(self._values, self._running, strict=True)]
        self._host_stops = [step if d else s for d, s in zip(flags, steps, strict=True)]
        self._running = [a and not d for a, d in zip(self._running, flags, strict=True)]
        return done

    def stops(self, last: int) -> Tensor | None:
        """(B,) int64 each sample's steps, the running ones stopping at ``last``; None when no
        sample was frozen (they all took ``last``)."""
        if self._stops is not None and self.mask is not None:
            return self._stops.masked_fill(self.mask, last)
        if self._host_stops is None:
            return None
        steps = [last if a else s for a, s in zip(self._running, self._host_stops, strict=True)]
        return torch.tensor(steps, dtype=torch.int64, device=self.device)


def _warn_if_coupled(name: str, solved: State, replayed: State, counts: list[int]) -> None:
    """Warn ``BatchCouplingWarning`` when the per-sample replay ``replayed`` differs from the
    solve's value ``solved`` (one host synchronisation)."""
    diff = max(float((a - b.detach()).abs().max()) if a.numel() else 0.0
               for a, b in zip(solved, replayed, strict=True))  # fmt: skip
    if diff == 0.0:
        return
    warnings.warn(
        f"{name}: the samples stopped at different steps ({min(counts)} to {max(counts)}) and "
        f"the gradient steps replayed from each sample's own iterate differ from the solve's "
        f"value by up to {diff:.3e}: f couples the samples (a batch statistic, attention "
        "over the batch) or computes differently with gradient. The value returned is the "
        "solve's; the gradient is that of the replayed steps, taken at a batch the solve never "
        "saw. For a batch-coupled f use tol=None (a fixed budget) or Unroll.",
        BatchCouplingWarning,
        stacklevel=user_stacklevel(),
    )


def _warn_if_frozen_drift(name: str, rec: TraceRecorder, stops: _Stops) -> None:
    """Warn ``BatchCouplingWarning`` when a frozen sample's residual moved while it was held.

    A sample frozen at step s keeps its iterate, and every later step still measures ``f`` at
    it (beside the running samples): for an ``f`` that treats samples independently that
    residual is the same at every later step; for one that couples them (a batch mean, a 1-D
    z0 whose entries are read as samples) it moves with the batch-mates, and the residual and
    stop recorded for the sample are stale. Compares the step after each freeze with the last
    step, from the recorded trace (no evaluation of ``f``; one host synchronisation, only when
    some sample stopped before the others)."""
    if not stops.staggered or stops.per_sample is None:
        return
    last = stops.last
    held = stops.per_sample < last - 1  # frozen with at least two later steps measured
    if not bool(held.any()):
        return
    trace = torch.stack(rec.residuals)  # (steps, B)
    after = trace.gather(0, stops.per_sample.clamp(max=last - 1)[None])[0]
    final = trace[last - 1]
    size = torch.stack(rec.sizes)[last - 1]
    moved = held & ((final - after).abs() > 1e-4 * after + 8 * torch.finfo(final.dtype).eps * size)
    if not bool(moved.any()):
        return
    i = int(torch.where(moved, (final - after).abs(), -1.0).argmax())
    warnings.warn(
        f"{name}: f couples the samples of the batch: sample {i}, frozen at step "
        f"{int(stops.per_sample[i])} (held since), measures a change of {float(after[i]):.3e} "
        f"the step after and {float(final[i]):.3e} at step {last} ({int(moved.sum())} frozen "
        "samples moved): its residual depends on batch-mates that kept moving, so the residual "
        "and stop recorded for the frozen samples are stale. For a batch-coupled f use tol=None "
        "(a fixed budget), or Anderson / Broyden, which check the returned point as one batch.",
        BatchCouplingWarning,
        stacklevel=user_stacklevel(),
    )


@dataclass
class _Stops:
    """Where each sample of a solve with a tolerance stopped.

    Attributes:
        per_sample: (B,) int64 steps of each sample; None when they all took ``last``, the
            solve's steps (the largest).
        starts: per sample the iterate ``keep`` steps before its stop (None without ``keep``).
        staggered: whether some sample stopped before the others.
        finite: whether every step's stopping metric was finite (then so was every step).
        converged: whether every sample met the tolerance.
    """

    per_sample: Tensor | None
    last: int
    starts: State | None
    staggered: bool
    finite: bool
    converged: bool


def _environment() -> tuple[bool, bool, bool]:
    """What a solve needs to know of its calling context, read once per solve (each read is a
    few Python calls; on the path of a small solve, run with cold caches after the steps'
    kernels, they add up):

    * recording: whether a gradient step can record anything: grad mode, a torch.func
      transform or forward-mode AD (dual tensors propagate under no_grad). Without any of them
      every step runs without gradient: the value is the same, and a tolerance solve skips its
      replay;
    * checks: whether host-side checks may run (``host_checks``: not under vmap, not while
      torch.compile traces);
    * stats now: whether the stats' tensors must be computed at once (``TraceRecorder.build``:
      under a transform or while compiling)."""
    compiling = torch.compiler.is_compiling()
    transforms = [] if compiling else active_transforms()
    recording = torch.is_grad_enabled() or bool(transforms) or forward_ad._current_level >= 0
    return recording, not compiling and "Vmap" not in transforms, compiling or bool(transforms)


def _rows(mask: Tensor, like: Tensor) -> Tensor:
    """The (B,) mask shaped to broadcast over ``like`` (B, ...)."""
    return mask.view(mask.shape[0], *([1] * (like.ndim - 1)))


def _select(mask: Tensor, a: State, b: State) -> State:
    """Per sample ``a`` where ``mask`` else ``b``."""
    return tuple(torch.where(_rows(mask, x), x, y) for x, y in zip(a, b, strict=True))


def _advance(step: StepFn, z: State, rec: TraceRecorder) -> State:
    z_next = step(z)
    rec.record(z, z_next)
    return z_next


def _bounds(values: Tensor) -> tuple[float, float]:
    """The (min, max) of ``values`` on the host: one synchronisation (the pair is stacked and
    copied once)."""
    bounds = torch.aminmax(values)
    low, high = torch.stack((bounds.min, bounds.max)).tolist()
    return low, high


_HOST_REDUCE = 256  # samples: up to this batch size ``_Running`` decides on the host
