"""Statistics of forward solves and backward (adjoint) solves, and the recorder that builds them.

Forward statistics are kept on the device as tensors and built without a host synchronisation
per step; reading them (``summary()``) synchronises once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar, cast

import torch
from torch import Tensor

from implicit_ham._core.errors import NonFiniteError
from implicit_ham._core.state import (
    State,
    combine_norms,
    finite_flags,
    per_sample_norm,
    per_tensor_norms,
)
from implicit_ham._core.transforms import active_transforms

V = TypeVar("V")


@dataclass
class SolverStats:
    """What a forward solve did.

    Attributes:
        solver: the solver's name.
        steps: iterations taken (evaluations of the solver's step).
        residuals: (steps, B) absolute residual ``||f(z_k) - z_k||`` of each iterate, per sample;
            (1, B), the last step only, for a ``FixedPointIteration`` without tolerance and
            without ``trace=True`` (its per-step trace is opt-in).
        abs_residual: (B,) the last absolute residual.
        rel_residual: (B,) the last residual divided by the norm of the iterate it produced.
        converged: (B,) bool, ``rel/abs residual <= tol``; None when the solver had no tolerance.
        sample_steps: (B,) int64, the steps each sample took before it was frozen (per-sample
            stopping: with a tolerance, a sample that has converged takes no further update while
            the others go on); None when every sample took ``steps`` (no tolerance, or a solver
            without per-sample stopping). ``steps`` is the batch's count (the largest).
    """

    solver: str
    steps: int
    residuals: Tensor
    abs_residual: Tensor
    rel_residual: Tensor
    converged: Tensor | None
    sample_steps: Tensor | None = None

    def steps_per_sample(self) -> Tensor:
        """(B,) int64: ``sample_steps``, or ``steps`` for every sample when it is None."""
        if self.sample_steps is not None:
            return self.sample_steps
        return torch.full((self.abs_residual.shape[0],), self.steps, dtype=torch.int64)

    def summary(self) -> dict[str, str | float | int | bool | None]:
        """Plain numbers (max over the batch); synchronises with the device once."""
        return {
            "solver": self.solver,
            "steps": self.steps,
            "abs_residual": _worst(self.abs_residual),
            "rel_residual": _worst(self.rel_residual),
            "converged": None if self.converged is None else bool(self.converged.all()),
        }


class _Deferred(Generic[V]):
    """A ``RecordedStats`` attribute: its ``index``-th tensor, computed with the others on
    first read; assignable like a dataclass field."""

    def __init__(self, index: int, doc: str) -> None:
        self.index, self.__doc__ = index, doc

    def __get__(self, stats: RecordedStats | None, owner: type | None = None) -> V:
        if stats is None:  # read on the class: the descriptor itself
            return cast(V, self)
        return cast(V, stats._get(self.index))

    def __set__(self, stats: RecordedStats, value: V) -> None:
        stats._set(self.index, cast("Tensor | None", value))


class RecordedStats(SolverStats):
    """``SolverStats`` whose tensors (``residuals``, ``abs_residual``, ``rel_residual``,
    ``converged``) are computed from the recorded per-step norms when one of them is first
    read: the same attributes and values as ``SolverStats``, without the few tensor operations
    at the end of every solve (stacking the trace, the relative residual, the stopping test)
    that most callers never read the result of. ``TraceRecorder.build`` makes them
    (``deferred``); the constructor is ``SolverStats``' (so ``dataclasses.replace`` works).
    """

    def __init__(
        self,
        solver: str,
        steps: int,
        residuals: Tensor,
        abs_residual: Tensor,
        rel_residual: Tensor,
        converged: Tensor | None,
        sample_steps: Tensor | None = None,
    ) -> None:
        self.solver, self.steps, self.sample_steps = solver, steps, sample_steps
        self._tensors: Callable[[], tuple[Tensor, Tensor, Tensor, Tensor | None]] | None = None
        self._values: list[Tensor | None] | None = [
            residuals,
            abs_residual,
            rel_residual,
            converged,
        ]

    @classmethod
    def deferred(
        cls,
        solver: str,
        steps: int,
        sample_steps: Tensor | None,
        tensors: Callable[[], tuple[Tensor, Tensor, Tensor, Tensor | None]],
    ) -> RecordedStats:
        """Stats whose tensors ``tensors()`` computes (once) when one of them is first read:
        (residuals (steps, B), abs_residual (B,), rel_residual (B,), converged (B,) or None)."""
        stats = cls.__new__(cls)
        stats.solver, stats.steps, stats.sample_steps = solver, steps, sample_steps
        stats._tensors, stats._values = tensors, None
        return stats

    def __reduce__(self) -> tuple[type[RecordedStats], tuple[object, ...]]:
        """Pickled (and deep-copied) with its tensors computed: the recipe is a closure."""
        values = [self._get(i) for i in range(4)]
        return type(self), (self.solver, self.steps, *values, self.sample_steps)

    def _get(self, index: int) -> Tensor | None:
        if self._values is None:
            assert self._tensors is not None
            self._values = list(self._tensors())
            self._tensors = None
        return self._values[index]

    def _set(self, index: int, value: Tensor | None) -> None:
        self._get(index)
        assert self._values is not None
        self._values[index] = value

    residuals = _Deferred[Tensor](0, "(steps, B) absolute residual of each recorded step.")
    abs_residual = _Deferred[Tensor](1, "(B,) the last absolute residual.")
    rel_residual = _Deferred[Tensor](
        2, "(B,) the last residual divided by the norm of the iterate it produced."
    )
    converged = _Deferred["Tensor | None"](
        3, "(B,) bool, the stopping test at the last step; None without a tolerance."
    )


def _worst(values: Tensor) -> float:
    """The largest of the (B,) non-negative values; 0.0 for an empty batch."""
    return float(values.max()) if values.numel() else 0.0


@dataclass
class BackwardStats:
    """What one backward solve of an implicit-type adjoint did.

    Attributes:
        adjoint: the backward mode (e.g. "implicit", "neumann").
        linear_solver: the linear solver's name ("neumann_series" for Neumann).
        steps: matrix-vector products (VJPs) spent in the solve.
        abs_residual: ``||g - J^T g - v||`` at the returned adjoint vector g.
        rel_residual: ``abs_residual / ||v||``.
        converged: whether ``rel_residual <= tol``; None for a fixed truncation (Neumann).
        cond: κ of the system solved (``I - J``, ``dg/dz``, the Hessian), exact, when the
            solver obtained it (the dense solvers); None: κ unknown (an iterative solve).
        fallback: True when ``on_divergence="fallback"`` replaced the solve's result (or, at a
            point that is not a fixed point, the solve itself) by the one-step gradient (g = v).
        forward_residual: ``||f(z*) - z*|| / ||f(z*)||`` at the point differentiated (worst
            sample); None when not measured.
        at_fixed_point: whether that residual is within the mode's ``fixed_point_tol`` (None
            when not checked).
        cond_lower_bound: a lower bound of κ from GMRES's Arnoldi matrices (of the scaled
            system when the solve was scaled): conclusive when large, no evidence when small
            (a one-step Krylov space bounds κ by 1); None when not measured.
    """

    adjoint: str
    linear_solver: str
    steps: int
    abs_residual: float
    rel_residual: float
    converged: bool | None
    cond: float | None = None
    fallback: bool = False
    forward_residual: float | None = None
    at_fixed_point: bool | None = None
    cond_lower_bound: float | None = None


@dataclass
class TraceRecorder:
    """Accumulates per-step residuals on the device (no host sync).

    Per step it keeps the (B,) absolute residual, the (B,) norm of the new iterate (the
    denominator of the relative residual, divided once when the stats are built) and the
    (B, n_tensors) norms of each state tensor's change ((B,) for a one-tensor state); the
    finiteness of a step is read from those norms only when ``check_finite`` asks (no per-step
    flag is computed). For a one-tensor state the norms are one ``vector_norm`` each (no
    per-tensor stacking or rescaling).
    """

    solver: str
    scale: float = 1.0
    residuals: list[Tensor] = field(default_factory=list)
    sizes: list[Tensor] = field(default_factory=list)
    parts: list[Tensor] = field(default_factory=list)
    sample_steps: Tensor | None = None

    def record(self, z_prev: State, z_next: State) -> Tensor:
        """Record one step ``z_prev -> z_next``; return its (B,) absolute residual.

        A state tensor counts as non-finite at this step if the norm of its change is NaN / inf:
        that catches a NaN / inf in the new iterate (the previous one was checked already) and a
        change whose size overflows, in the same reduction that measures the residual.

        ``scale`` undoes a damping factor: for ``z' = a f(z) + (1-a) z``, ``||f(z) - z|| =
        ||z' - z|| / a``.
        """
        if len(z_next) == 1 and not (z_next[0].requires_grad or z_prev[0].requires_grad):
            res, size = self._one(z_prev[0], z_next[0])  # no graph: no detach, no no_grad
        else:
            with torch.no_grad():
                if len(z_next) == 1:
                    res, size = self._one(z_prev[0].detach(), z_next[0].detach())
                else:
                    nxt = tuple(t.detach() for t in z_next)
                    changes = (x - y.detach() for x, y in zip(nxt, z_prev, strict=True))
                    parts = per_tensor_norms(tuple(changes))
                    self.parts.append(parts)
                    res, size = combine_norms(parts), per_sample_norm(nxt)
        if self.scale != 1.0:
            res = res / self.scale
        self.residuals.append(res)
        self.sizes.append(size)
        return res

    def _one(self, prev: Tensor, nxt: Tensor) -> tuple[Tensor, Tensor]:
        """A one-tensor state's step: its (B,) change norm (kept as the step's part) and the
        (B,) norm of the new iterate."""
        res = _sample_norm(nxt - prev)
        self.parts.append(res)
        return res, _sample_norm(nxt)

    def excess(self, tol: float, stop_mode: str) -> Tensor:
        """(B,) the last step's stopping metric minus ``tol``, ``<= 0`` where a sample meets the
        tolerance: ``res - tol * size`` ("rel": ``res / size <= tol`` without a division per
        step) or ``res - tol`` ("abs"). ``converged_at`` decides with the same expression, so
        the solve's stop and the reported ``converged`` flag always agree."""
        if stop_mode == "rel":
            return torch.sub(self.residuals[-1], self.sizes[-1], alpha=tol)
        return self.residuals[-1] - tol

    def last_step_finite(self) -> bool:
        """One reduction and one host synchronisation: whether the last recorded change is
        finite (a NaN / inf in the final state, or in the one before it, makes the norm of its
        change non-finite). The norm of the (B,) norms is finite exactly when they all are, but
        for one that overflows, which the exact (slower) test then clears. (A norm, not a sum:
        the kernel that measured the step, still in the caches at the end of a solve.)"""
        last = self.parts[-1]
        return math.isfinite(float(torch.linalg.vector_norm(last))) or bool(
            torch.isfinite(last).all()
        )

    def check_finite(self, z0: State, steps_offset: int = 0) -> None:
        """Raise NonFiniteError naming the first step and state tensor that went non-finite.

        One reduction over the recorded (steps, B, n_tensors) norms and one host
        synchronisation when everything is finite; z0 and the steps are examined one by one
        only to name the culprit."""
        if self.parts:
            stacked = torch.stack(self.parts)
            if math.isfinite(float(stacked.sum())) or bool(torch.isfinite(stacked).all()):
                return
        z0_flags = finite_flags(tuple(t.detach() for t in z0))
        rows = (torch.isfinite(p.reshape(p.shape[0], -1)).all(0) for p in self.parts)
        flags = torch.stack([z0_flags, *rows])
        if bool(flags.all()):
            return
        bad = (~flags).nonzero()[0].tolist()
        step, tensor = bad[0], bad[1]
        where = "the initial state z0" if step == 0 else f"forward step {step + steps_offset}"
        raise NonFiniteError(
            f"{self.solver}: non-finite value (NaN or inf, or a step whose size overflows) in "
            f"state[{tensor}] at {where}. Check f for overflow or division by zero, damp the "
            "iteration, or use float64."
        )

    def build(
        self,
        batch: int,
        device: torch.device,
        dtype: torch.dtype,
        tol: float | None,
        stop_mode: str,
        steps: int | None = None,
        now: bool | None = None,
    ) -> SolverStats:
        """The SolverStats of everything recorded so far. With ``sample_steps`` (B,) set (a
        solve that froze samples as they converged), each sample's rows after its stop repeat
        its residual at the stop, so its trace and final residuals are those of solving it
        alone. ``steps``: the solve's iterations when it recorded only its last (default: the
        steps recorded). The tensors are computed when first read (``RecordedStats``), at once
        under a torch.func transform or while torch.compile traces (whose tensors must not
        outlive them); ``now``: whether one of those is active, when the caller has read it
        already (default: read here)."""
        residuals, sizes, sample_steps = list(self.residuals), list(self.sizes), self.sample_steps

        def tensors() -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
            if residuals:
                both = torch.stack(residuals + sizes).view(2, len(residuals), *sizes[0].shape)
                if sample_steps is not None:  # every sample stops after >= 1 step
                    rows = torch.arange(len(residuals), device=both.device)[:, None]
                    at_stop = torch.minimum(rows, sample_steps[None] - 1)
                    both = both.gather(1, at_stop.expand(2, -1, -1))
                trace, last_abs, last_size = both[0], both[0, -1], both[1, -1]
                last_rel = _relative(last_abs, last_size)
            else:
                trace = torch.zeros(0, batch, device=device, dtype=dtype)
                last_abs = last_rel = last_size = torch.full(
                    (batch,), float("nan"), device=device, dtype=dtype
                )
            if tol is None:
                return trace, last_abs, last_rel, None
            metric = torch.sub(last_abs, last_size, alpha=tol) if stop_mode == "rel" else (
                last_abs - tol)  # fmt: skip
            return trace, last_abs, last_rel, metric <= 0  # ``excess``'s test, to the bit

        count = len(residuals) if steps is None else steps
        stats = RecordedStats.deferred(self.solver, count, sample_steps, tensors)
        if (torch.compiler.is_compiling() or bool(active_transforms())) if now is None else now:
            stats.residuals  # noqa: B018 (computed now)
        return stats


def _relative(res: Tensor, size: Tensor) -> Tensor:
    """(B,) ``res / size``, a zero size counted as the smallest normal number."""
    return res / size.clamp_min(torch.finfo(res.dtype).tiny)


def _sample_norm(t: Tensor) -> Tensor:
    """(B,): the Euclidean norm of each sample of ``t`` (B, ...)."""
    return t.abs() if t.ndim == 1 else torch.linalg.vector_norm(t, dim=tuple(range(1, t.ndim)))
