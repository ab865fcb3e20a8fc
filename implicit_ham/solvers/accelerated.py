"""The native accelerated forward solvers: ``Anderson`` and ``Broyden``.

Both run the kernels of ``implicit_ham.linalg.acceleration`` on the state flattened to (B, N)
without gradient and return, per sample, the evaluated iterate with the lowest residual, so its
residual is known without another evaluation of ``f`` (``NativeSolver``). A through-iteration
backward mode differentiates plain steps of ``f`` it takes from the solution itself
(``adjoints.modes.solve_through_iterations``).
Their options (``solvers.options``) are those of torchdeq's solvers (``solvers.torchdeq``:
``TorchDEQAnderson``, ``TorchDEQBroyden``), the references they are tested and benchmarked
against.
"""

from __future__ import annotations

import logging
import warnings
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from implicit_ham._core.caller import user_stacklevel
from implicit_ham._core.errors import BatchCouplingWarning
from implicit_ham._core.state import (
    State,
    StateSpec,
    StepFn,
    detached,
)
from implicit_ham._core.stats import SolverStats
from implicit_ham._core.transforms import host_checks
from implicit_ham._core.validation import check_tolerance
from implicit_ham.linalg.acceleration import Iterate, anderson, broyden
from implicit_ham.solvers.base import (
    SOLVERS,
    FixedPointSolver,
    raise_non_finite,
    refuse_vmap,
    warn_if_not_converged,
)
from implicit_ham.solvers.options import AndersonSolverOptions, BroydenSolverOptions

logger = logging.getLogger(__name__)


class NativeSolver(FixedPointSolver):
    """Shared frame of the native accelerated solvers (``implicit_ham.linalg.acceleration``).

    The solve spends ``max_steps`` evaluations of ``f`` without gradient (fewer when every
    sample meets ``tol`` first; ``stats.steps`` counts them) and returns, per sample, the
    evaluated iterate with the lowest residual. After it, ``f`` is evaluated once more at the
    solution z*, on top of the budget, only when z* assembles samples from different
    evaluations (frozen at different steps, or best at different evaluations), to measure z*
    as one batch. That measurement is
    the check of an ``f`` that couples the samples: when z*'s residuals as one batch differ
    from those the per-sample solve recorded, ``BatchCouplingWarning`` says so and the solve is
    run again with one criterion for the whole batch, whose residuals are those of z*
    (``batch_coupled=True`` solves so at once). Host synchronisations: one per evaluation with
    a tolerance (the stopping decision, which also detects NaN / inf), one or two per solve
    without.
    """

    max_steps: int
    tol: float | None
    stop_mode: str
    batch_coupled: bool

    @abstractmethod
    def _iterate(
        self, flat_f: Callable[[Tensor], Tensor], x0: Tensor, budget: int, whole_batch: bool
    ) -> Iterate:
        """Run the native solver on (B, N) states."""

    def solve(self, f: StepFn, z0: State, spec: StateSpec) -> tuple[State, SolverStats]:
        refuse_vmap(self)
        flat = _Flat(spec)

        def flat_f(x: Tensor) -> Tensor:
            return flat.flatten(f(flat.unflatten(x)))

        x0 = flat.flatten(z0)
        with torch.no_grad():
            result = self._iterate(flat_f, x0, self.max_steps, self.batch_coupled)
        if result.failed_at is not None:
            raise_non_finite(self.name, z0, result.failed_at)
        z = detached(flat.unflatten(result.x))
        image: State | None = None  # f(z) as one batch, when evaluated here
        if result.image is None and not self.batch_coupled and host_checks():
            with torch.no_grad():
                image = f(z)
        if not self.batch_coupled and host_checks():
            at_z = result.image if image is None else flat.flatten(detached(image))
            if at_z is not None and _coupled(self, result, at_z, spec):
                with torch.no_grad():
                    result = self._iterate(flat_f, x0, self.max_steps, True)
                if result.failed_at is not None:
                    raise_non_finite(self.name, z0, result.failed_at)
                z = detached(flat.unflatten(result.x))
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
            result.sample_steps,
        )
        warn_if_not_converged(stats, self.tol)
        return z, stats


@SOLVERS.register("anderson")
@dataclass(frozen=True)
class Anderson(AndersonSolverOptions, NativeSolver):
    """Anderson acceleration (native, ``implicit_ham.linalg.acceleration.anderson``); the default
    accelerated solver. ``TorchDEQAnderson`` ("torchdeq_anderson") runs torchdeq's.

    Args:
        max_steps: evaluations of ``f`` the solve spends (>= 4; exactly ``max_steps`` unless
            every sample meets ``tol`` first; the one evaluation at z* a gradient step or a
            measurement adds comes on top, see ``NativeSolver``). tol: stopping tolerance
            (None: use the budget).
        m: history size (>= 2). lam: Tikhonov regularisation of the mixing system, relative
            to the mean squared residual of the stored history (``relative_lam=True``, the
            default: scale-free, as SciPy's ``w0``), or absolute (torchdeq's).
        retry_lam: the regularisation of the retry (below).
        damping: mixing step size in (0, 1]. stop_mode: "rel" or "abs".
        relative_lam: whether ``lam`` is relative (True) or absolute (False, torchdeq's: an
            absolute 1e-4 outweighs the squared residuals once they fall below about 1e-2,
            and the mixing then averages old iterates: on the tanh cell of
            ``docs/solvers.md`` it took 14 evaluations where plain iteration took 9).
        restart: clear a sample's history when its newest residual exceeds ``restart`` times
            the smallest residual in that history (the next step is then a plain step from
            the newest iterate); None never restarts (torchdeq's). On the Hamburger maps (VQ,
            CD) the iteration passes through phases where the mixing of stale residuals
            extrapolates away from the fixed point; the restart is what makes Anderson beat
            plain iteration there (``docs/solvers.md``, "Anderson's defaults").
        polish: spend the last evaluation of the solve on ``f(x_best)`` and return, per
            sample, whichever of ``x_best`` and ``f(x_best)`` has the lower measured residual
            (torchdeq returns ``f(x_best)`` without measuring it). Off by default: one more
            evaluation with a tolerance; at a fixed budget one Anderson step fewer, for a
            residual several times lower on contractive maps (``docs/benchmarks_peers.md``,
            target 6). The value is the same under every backward mode either way.
        batch_coupled: as ``Broyden``'s.

    A singular mixing system or a non-finite iterate is retried once with ``lam`` raised to
    ``retry_lam``; if that fails too, NonFiniteError is raised.
    """

    polish: bool = False
    batch_coupled: bool = False
    relative_lam: bool = True
    restart: float | None = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_tolerance(type(self).__name__, "restart", self.restart, optional=True)

    def _iterate(
        self, flat_f: Callable[[Tensor], Tensor], x0: Tensor, budget: int, whole_batch: bool
    ) -> Iterate:
        retry = self.attempts[1]
        for attempt, lam in enumerate(self.attempts):
            result = anderson(
                flat_f,
                x0,
                max_evals=budget,
                tol=self.tol,
                stop_mode=self.stop_mode,
                m=self.m,
                lam=lam,
                damping=self.damping,
                polish=self.polish,
                whole_batch=whole_batch,
                relative_lam=self.relative_lam,
                restart=self.restart,
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
class Broyden(BroydenSolverOptions, NativeSolver):
    """Broyden's method (native, ``implicit_ham.linalg.acceleration.broyden``, no line search).
    ``TorchDEQBroyden`` ("torchdeq_broyden") runs torchdeq's.

    Args:
        max_steps: evaluations of ``f`` the solve spends (>= 3; exactly ``max_steps`` unless
            every sample meets ``tol`` first; see ``NativeSolver`` for the one on top). tol:
            stopping tolerance (None: use the budget). stop_mode: "rel" or "abs".
        batch_coupled: solve the batch as one problem (no sample frozen, the evaluated batch
            with the lowest worst-sample residual returned), for an ``f`` that couples the
            samples; without it such an ``f`` is detected at the returned point
            (``BatchCouplingWarning``) and solved again so.
    """

    batch_coupled: bool = False

    def _iterate(
        self, flat_f: Callable[[Tensor], Tensor], x0: Tensor, budget: int, whole_batch: bool
    ) -> Iterate:
        return broyden(
            flat_f,
            x0,
            max_evals=budget,
            tol=self.tol,
            stop_mode=self.stop_mode,
            whole_batch=whole_batch,
        )


def _coupled(solver: NativeSolver, result: Iterate, image: Tensor, spec: StateSpec) -> bool:
    """Whether ``f`` couples the samples, from its value ``image`` (B, N) at the returned point
    ``result.x`` evaluated as one batch: True, after a ``BatchCouplingWarning`` with the numbers,
    when some sample's residual there differs from the one the per-sample solve recorded for it
    (beyond 1e-3 relative and rounding) or falls on the other side of ``tol`` beyond rounding
    (one host synchronisation). The samples the solve froze, or whose best iterate came from an
    earlier evaluation, were recorded beside batch-mates that have moved since."""
    abs_res = torch.linalg.vector_norm(image - result.x, dim=1)
    size = torch.linalg.vector_norm(image, dim=1)
    rel_res = abs_res / size.clamp_min(torch.finfo(image.dtype).tiny)
    rounding = 8 * torch.finfo(image.dtype).eps * size
    differs = (abs_res - result.abs_residual).abs() > 1e-3 * result.abs_residual + rounding
    if solver.tol is not None:
        use_rel = solver.stop_mode == "rel"
        metric = rel_res if use_rel else abs_res
        recorded = result.rel_residual if use_rel else result.abs_residual
        # a side of tol counts only beyond the metric's rounding: a sample sitting at tol is
        # not re-solved for the last bit of a norm computed twice
        margin = 8 * torch.finfo(image.dtype).eps * (torch.ones_like(size) if use_rel else size)
        crossed = (metric <= solver.tol) != (recorded <= solver.tol)
        differs |= crossed & ((metric - recorded).abs() > margin)
    if not bool(differs.any()):
        return False
    i = int(torch.where(differs, rel_res, -1.0).argmax())  # the worst sample that differs
    hint = (
        f" z0 is {len(spec.shapes[0])}-D ({tuple(spec.shapes[0])}): its first dimension is read "
        "as the batch; if it is one sample, give it a batch dimension (z0[None])."
        if len(spec.shapes) == 1 and len(spec.shapes[0]) == 1
        else ""
    )
    warnings.warn(
        f"{solver.name}: f couples the samples of the batch: at the returned point sample {i}'s "
        f"relative residual is {float(rel_res[i]):.3e}, not the "
        f"{float(result.rel_residual[i]):.3e} the per-sample solve recorded for it "
        f"({int(differs.sum())} of {differs.numel()} samples differ: samples frozen at their "
        "stop, or returned at an earlier evaluation, were measured beside batch-mates that have "
        "moved since). Solved again with one criterion for the whole batch (no sample frozen; "
        "the evaluated batch with the lowest worst-sample residual is returned, its residuals "
        f"measured as a whole); pass batch_coupled=True to solve so at once.{hint}",
        BatchCouplingWarning,
        stacklevel=user_stacklevel(),
    )
    return True


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
