"""``LBFGS`` and ``NewtonCG``: line-search minimizers over a batch of independent problems.

Both iterate on the flat state viewed as rows (``line_search.Probe``): by default one row per
sample, each with its own curvature memory (L-BFGS) or CG solve (Newton-CG), its own step size
and its own stopping test, so a batch of B problems costs about B times one problem and a sample
that converges stops moving; with ``batch_coupled=True`` the whole state is one row (one
problem, today's treatment of a loss that couples the samples).

Tolerance: ``tol="auto"`` (the default) stops a sample once
``||grad|| <= max(1e-8, eps^(3/4)) · s``, eps the dtype's machine epsilon and
``s = max(1, ||grad(z0)||)`` the problem's gradient scale: 1e-8 s in float64 (the former
default, about sqrt(eps)), 6.5e-6 s in float32. The exponent 3/4 sits between sqrt(eps) (where
a value-based Armijo test stops resolving a decrease: ``f`` changes by ``||grad||² / 2``; too
loose for a float32 hypergradient accurate to 1e-4) and eps (the gradient's own rounding floor,
which the directional-derivative test of ``line_search`` still follows); a fixed ``1e-8``
cannot be reached in float32. A float is an absolute
tolerance, as before; None runs ``max_steps`` steps (unless the search stalls).

A sample stalls when no step is acceptable (see ``line_search``) or, once its gradient norm is
below ``sqrt(eps) · s`` (the rounding regime), that norm has not halved its best value for
``STALL_STEPS`` steps (the rounding floor): it stops there, converged
if its gradient is within tolerance, otherwise reported by a ``ConvergenceWarning`` that says
the search stalled (not that the budget ran out).
Their steps are not differentiable maps: the through-iteration modes are refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from implicit_ham._core.errors import ConvergenceWarning, NonFiniteError
from implicit_ham._core.events import events
from implicit_ham._core.state import State
from implicit_ham._core.stats import SolverStats
from implicit_ham._core.transforms import host_checks
from implicit_ham._core.validation import check_positive_int, check_tolerance
from implicit_ham.solvers.line_search import Probe, Step, backtrack
from implicit_ham.solvers.minimizers import MINIMIZERS, Minimizer, Objective

Tolerance = float | Literal["auto"] | None
STALL_STEPS = 10
AUTO_FLOOR = 1e-8  # "auto" is never tighter than the former float64 default


def check_auto_budget(owner: str, max_steps: object, tol: object) -> None:
    """ValueError unless ``max_steps`` is a positive int and ``tol`` "auto", None or > 0."""
    check_positive_int(owner, "max_steps", max_steps)
    if tol != "auto":
        check_tolerance(owner, "tol", tol, optional=True)


def resolve_tolerance(tol: Tolerance, first: Tensor) -> Tensor | None:
    """(B,) per-sample gradient-norm tolerance from ``tol`` and the initial gradient norms
    ``first`` (B,) of each sample's problem: "auto" is
    ``max(1e-8, eps^(3/4)) · max(1, ||grad(z0)||)``; a float, itself."""
    if tol is None:
        return None
    if tol == "auto":
        rate = max(AUTO_FLOOR, torch.finfo(first.dtype).eps ** 0.75)
        return rate * first.clamp_min(1.0)
    return torch.full_like(first, float(tol))


class LineSearchMinimizer(Minimizer):
    """The shared loop: per-row directions from ``_directions``, ``line_search.backtrack``,
    per-sample stopping (converged, stalled or out of steps) and the statistics."""

    max_steps: int
    tol: Tolerance  # type: ignore[assignment]

    def _memory(self, probe: Probe) -> DirectionRule:
        """The per-row direction rule of this solver (curvature memory, CG)."""
        raise NotImplementedError

    def minimize(self, objective: Objective, z0: State) -> tuple[State, SolverStats]:
        spec = objective.spec
        x0 = objective.flat(z0).detach().reshape(spec.batch, -1)
        probe = Probe.of(objective, x0)
        x = probe.view(x0)
        value, grad = probe.evaluate(x)
        row_norms = torch.linalg.vector_norm(grad, dim=1)
        first = _sample_norms(grad, row_norms, spec.batch)
        # "auto" scales with each problem's gradient: each sample's, or a coupled row's
        tol = resolve_tolerance(self.tol, _per_sample(probe, row_norms, spec.batch))
        norms, rows = first, [first]
        stalled: Tensor | None = None  # set once a stall test has run
        progress = _Progress(row_norms)  # per row: a coupled row stalls as a whole
        memory = self._memory(probe)
        active = _active_rows(probe, norms, tol, stalled)
        count = _open_rows(self.name, active, first, 0)
        for step in range(1, self.max_steps + 1):
            if count == 0:
                break
            direction = memory.direction(x, grad)
            if count < probe.rows:  # finished rows do not move
                direction = direction * active[:, None]
            slope0 = torch.linalg.vecdot(grad, direction)
            downhill = count == probe.rows and bool((slope0 < 0).all())  # the common case
            if not downhill:
                direction, slope0 = memory.descend(direction, grad, slope0, active)
            result = backtrack(probe, x, value, grad, direction, active, slope0, downhill)
            memory.update(x, grad, result)
            x, value, grad = result.x, result.value, result.grad
            row_norms = torch.linalg.vector_norm(grad, dim=1)
            norms = _sample_norms(grad, row_norms, spec.batch)
            progress.record(row_norms)
            if step >= STALL_STEPS or not result.full_step:  # else no row can be stuck yet
                stuck = active & (~result.accepted | progress.no_progress(step))
                stuck = _per_sample(probe, stuck, spec.batch)
                stalled = stuck if stalled is None else stalled | stuck
            rows.append(norms)
            active = _active_rows(probe, norms, tol, stalled)
            count = _open_rows(self.name, active, norms, step)
        if stalled is None:
            stalled = torch.zeros(spec.batch, dtype=torch.bool, device=x.device)
        trace = torch.stack(rows[1:]) if len(rows) > 1 else first.new_zeros(0, spec.batch)
        converged = None if tol is None else norms <= tol
        rel = norms / (first + torch.finfo(first.dtype).tiny)
        stats = SolverStats(self.name, len(rows) - 1, trace, norms, rel, converged)
        if tol is not None and converged is not None and host_checks() and not converged.all():
            self._warn(norms, tol, stalled & ~converged, stats.steps)
        return objective.state(x.reshape(-1)), stats

    def _warn(self, norms: Tensor, tol: Tensor, stalled: Tensor, steps: int) -> None:
        missed = norms > tol
        worst = float(norms.max())
        samples = torch.nonzero(missed).flatten().tolist()
        if bool(stalled.any()):
            why = (
                f"the line search stalled for samples {torch.nonzero(stalled).flatten().tolist()}"
                " (no step decreases the loss in this dtype: the rounding floor of the problem);"
                " use float64, rescale the loss, or a looser tol"
            )
        else:
            why = f"it ran out of steps ({steps}); raise max_steps or change the solver"
        events().warn(
            f"{self.name}: did not reach tol={float(tol[missed].max()):.3e} for samples "
            f"{samples} (worst residual {worst:.3e}): {why}",
            ConvergenceWarning,
            residual=worst,
            where=self.name,
        )


class DirectionRule:
    """Per-row search directions and what each accepted step teaches them."""

    def direction(self, x: Tensor, grad: Tensor) -> Tensor:
        """(rows, n): a search direction at x (``descend`` makes it a descent direction)."""
        raise NotImplementedError

    def descend(
        self, direction: Tensor, grad: Tensor, slope: Tensor, active: Tensor
    ) -> tuple[Tensor, Tensor]:
        """The direction to search along and its slopes (rows,) when some active row's
        ``slope = grad·direction`` is not negative: this rule's answer (here none: the search
        stalls such a row)."""
        return direction, slope

    def update(self, x: Tensor, grad: Tensor, step: Step) -> None:
        """Learn from the step from ``(x, grad)`` to ``step``."""


class _LBFGSMemory(DirectionRule):
    """Per-row curvature pairs ``(s, y)``, kept with ``rho s`` and ``rho y``
    (``rho = 1 / s·y``) for the two-loop recursion; a row's ``rho`` is zero (a no-op in the
    recursion) when its step was rejected or its curvature ``s·y`` not positive."""

    def __init__(self, history: int) -> None:
        self.history = history
        self.pairs: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []  # s, y, rho s, rho y
        self.gamma: Tensor | None = None  # (rows, 1): the initial inverse-Hessian scale

    def direction(self, x: Tensor, grad: Tensor) -> Tensor:
        if self.gamma is None:
            tiny = torch.finfo(grad.dtype).tiny
            self.gamma = 1.0 / torch.linalg.vector_norm(grad, dim=1, keepdim=True).clamp_min(tiny)
        q, alphas = grad, []
        for _, y, rho_s, _ in reversed(self.pairs):
            alpha = torch.linalg.vecdot(rho_s, q).unsqueeze(1)
            q = torch.addcmul(q, alpha, y, value=-1.0)
            alphas.append(alpha)
        q = q * self.gamma
        for (s, _, _, rho_y), alpha in zip(self.pairs, reversed(alphas), strict=True):
            q = torch.addcmul(q, alpha.sub_(torch.linalg.vecdot(rho_y, q).unsqueeze(1)), s)
        return q.neg_()

    def descend(
        self, direction: Tensor, grad: Tensor, slope: Tensor, active: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Active rows going uphill restart from scaled steepest descent, their pairs dropped
        (a row whose direction is zero keeps it)."""
        moving = active & (slope >= 0) & direction.any(dim=1)
        if not bool(moving.any()):
            return direction, slope
        norm = torch.linalg.vector_norm(grad, dim=1, keepdim=True)
        steepest = -grad / norm.clamp_min(torch.finfo(grad.dtype).tiny)
        direction = torch.where(moving[:, None], steepest, direction)
        keep = (~moving).to(grad.dtype)[:, None]
        self.pairs = [(s, y, rs * keep, ry * keep) for s, y, rs, ry in self.pairs]
        return direction, torch.linalg.vecdot(grad, direction)

    def update(self, x: Tensor, grad: Tensor, step: Step) -> None:
        s, y = step.x - x, step.grad - grad
        sy = (s * y).sum(1, keepdim=True)
        s_norm = torch.linalg.vector_norm(s, dim=1, keepdim=True)
        y_norm = torch.linalg.vector_norm(y, dim=1, keepdim=True)
        good = sy > 1e-10 * s_norm * y_norm  # implies s·y > 0
        if not step.full_step:
            good = good & step.accepted[:, None]
        rho = torch.where(good, sy.reciprocal(), 0.0)
        self.pairs.append((s, y, rho * s, rho * y))
        if len(self.pairs) > self.history:
            self.pairs.pop(0)
        assert self.gamma is not None
        self.gamma = torch.where(good, sy / y_norm.square(), self.gamma)


@MINIMIZERS.register("lbfgs")
@dataclass(frozen=True)
class LBFGS(LineSearchMinimizer):
    """L-BFGS (the two-loop recursion, per sample) with the batched rounding-robust
    backtracking search of ``line_search``.

    Args:
        max_steps: iterations. tol: "auto" (``max(1e-8, eps^(3/4)) · max(1, ||grad(z0)||)``
            per sample, see the module docstring), an absolute gradient-norm tolerance, or
            None.
        history: the number of curvature pairs kept.
    """

    max_steps: int = 200
    tol: Tolerance = "auto"
    history: int = 10

    def __post_init__(self) -> None:
        check_auto_budget("LBFGS", self.max_steps, self.tol)
        check_positive_int("LBFGS", "history", self.history)

    def _memory(self, probe: Probe) -> DirectionRule:
        return _LBFGSMemory(self.history)


class _NewtonCGRule(DirectionRule):
    def __init__(self, probe: Probe, cg_max_steps: int) -> None:
        self.probe, self.cg_max_steps = probe, cg_max_steps

    def direction(self, x: Tensor, grad: Tensor) -> Tensor:
        hvp = self.probe.objective.hvp(x)
        return truncated_cg(lambda v: hvp(v).reshape(v.shape), grad, self.cg_max_steps)


@MINIMIZERS.register("newton_cg")
@dataclass(frozen=True)
class NewtonCG(LineSearchMinimizer):
    """Truncated Newton: CG on ``H p = -grad`` per sample (Hessian-vector products), stopped at
    negative curvature (then the CG iterate so far, or ``-grad``), and the batched
    rounding-robust backtracking search of ``line_search``.

    Args:
        max_steps: Newton iterations. tol: as for ``LBFGS``. cg_max_steps: CG iterations per
            Newton step.
    """

    max_steps: int = 50
    tol: Tolerance = "auto"
    cg_max_steps: int = 100

    def __post_init__(self) -> None:
        check_auto_budget("NewtonCG", self.max_steps, self.tol)
        check_positive_int("NewtonCG", "cg_max_steps", self.cg_max_steps)

    def _memory(self, probe: Probe) -> DirectionRule:
        return _NewtonCGRule(probe, self.cg_max_steps)


def truncated_cg(hvp: Callable[[Tensor], Tensor], grad: Tensor, max_steps: int) -> Tensor:
    """(rows, n): per row an approximate solution of ``H p = -grad`` (H applied to all rows at
    once by ``hvp``), stopped per row at negative curvature (Steihaug) or at the forcing
    tolerance ``||r|| <= min(0.5, sqrt(||grad||)) ||grad||``."""
    p, r = torch.zeros_like(grad), -grad
    d, rr = r.clone(), (r * r).sum(1)
    target = grad.norm(dim=1).sqrt().clamp(max=0.5) ** 2 * rr
    active = rr > 0
    for _ in range(max_steps):
        hd = hvp(d * active[:, None])
        curvature = (d * hd).sum(1)
        active = active & (curvature > 0)
        alpha = torch.where(active, rr / torch.where(active, curvature, 1.0), 0.0)
        p, r = p + alpha[:, None] * d, r - alpha[:, None] * hd
        rr_next = (r * r).sum(1)
        active = active & (rr_next > target)
        if not bool(active.any()):
            break
        beta = torch.where(active, rr_next / rr.clamp_min(torch.finfo(rr.dtype).tiny), 0.0)
        d, rr = r + beta[:, None] * d, torch.where(active, rr_next, rr)
    empty = ~p.any(dim=1)
    return torch.where(empty[:, None], -grad, p)


def _sample_norms(grad: Tensor, row_norms: Tensor, batch: int) -> Tensor:
    """(B,): each sample's gradient norm, from the rows' (a coupled row holds all samples)."""
    if row_norms.numel() == batch:
        return row_norms
    return torch.linalg.vector_norm(grad.reshape(batch, -1), dim=1)


def _per_sample(probe: Probe, per_row: Tensor, batch: int) -> Tensor:
    """(B,) bool from a (rows,) flag (a coupled row's flag applies to every sample)."""
    return per_row.expand(batch) if probe.rows == 1 else per_row


def _active_rows(
    probe: Probe, norms: Tensor, tol: Tensor | None, stalled: Tensor | None
) -> Tensor:
    """(rows,) bool: the rows still being solved (not within tol and not stalled; ``stalled``
    None: no stall test has run yet)."""
    if tol is None:
        open_ = torch.ones_like(norms, dtype=torch.bool) if stalled is None else ~stalled
    else:
        open_ = norms > tol if stalled is None else ~stalled & (norms > tol)
    return open_.any().reshape(1) if probe.rows == 1 else open_


def _open_rows(solver: str, active: Tensor, norms: Tensor, step: int) -> int:
    """The number of active rows, read with the finiteness test of ``norms`` (B,) in one host
    read: their sum is finite when every norm is (when it is not, the exact test decides: the
    sum of finite norms may overflow)."""
    if not host_checks():
        return int(active.sum())
    count, total = torch.stack((active.sum(dtype=norms.dtype), norms.sum())).tolist()
    if not math.isfinite(total):
        _check_finite(solver, norms, step)
    return int(count)


class _Progress:
    """Per row, the best gradient norm so far (improved only by halving it) and the step it
    was reached: the stall test (see the module docstring). Brought up to date only when a
    stall test runs (none before ``STALL_STEPS`` steps unless a line search halved), so a
    short solve spends no work on it."""

    def __init__(self, first: Tensor) -> None:
        self.best = first
        self.best_step = torch.zeros_like(first, dtype=torch.long)
        self.floor = math.sqrt(torch.finfo(first.dtype).eps) * first.clamp_min(1.0)
        self.pending: list[Tensor] = []  # row norms of the steps not yet folded in
        self.step = 0  # the last step folded in

    def record(self, row_norms: Tensor) -> None:
        """The rows' gradient norms after one more step."""
        self.pending.append(row_norms)

    def no_progress(self, step: int) -> Tensor:
        """(rows,) bool: no halving of the best norm for ``STALL_STEPS`` steps and the norm
        below ``sqrt(eps) · max(1, ||grad(z0)||)`` (the rounding regime), as of ``step``."""
        latest = self.pending[-1]
        for row_norms in self.pending:
            self.step += 1
            improved = row_norms <= 0.5 * self.best
            self.best = torch.where(improved, row_norms, self.best)
            self.best_step = torch.where(improved, self.step, self.best_step)
        self.pending.clear()
        return (self.best_step <= step - STALL_STEPS) & (latest <= self.floor)


def _check_finite(solver: str, norms: Tensor, step: int) -> None:
    if host_checks() and not bool(torch.isfinite(norms).all()):
        where = "the initial state z0" if step == 0 else f"step {step}"
        raise NonFiniteError(
            f"{solver}: non-finite residual (NaN or inf) at {where}. Check the problem for "
            "overflow, damp the steps, or use float64."
        )
