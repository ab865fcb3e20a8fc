"""Forward solvers of ``least_squares``: ``GaussNewton`` and ``LevenbergMarquardt`` for
``½ C² Σ ρ(r² / C²)`` (``½||r||²`` for the linear loss), on P independent problems at once.

The solvers see a ``SumOfSquares``: a residual map from the flat variables x (P, n) to the
residuals (P, R), sample p depending on x[p] only. ``least_squares`` poses the batch as P = B
problems (the default) or, with ``batch_coupled=True``, as one problem over the whole batch
(P = 1). Every step is batched over the problems: per-sample Jacobians (``sample_jacobian``),
the P normal equations ``(Jᵀ W J [+ μ I]) Δ = -Jᵀ W r`` (W the robust loss's IRLS weights) by a
batched Cholesky factorisation (``torch.linalg.cholesky_ex``; the pseudo-inverse for a sample
whose system is singular), per-sample step sizes, damping and stopping. A problem that has
stopped is frozen while the others go on.

Stopping, per problem, after each step (and at the start):

* ``tol`` given: ``||g|| <= tol`` with ``g = Jᵀ W r`` the gradient (absolute, as documented).
* ``tol=None`` (the default): dtype-scaled tests with ``rtol`` (default ``sqrt(eps)`` of the
  dtype): the scaled gradient ``||g|| <= rtol ||J||_F ||√W r||`` (the cosine between the
  residuals and the Jacobian's range, scale free) or the step ``||Δ|| <= rtol (rtol + ||x||)``.
* The acceptance tests (Armijo for GN, the gain for LM) tolerate a cost change within the
  cost's rounding (``16 eps · cost``), and a step whose predicted decrease is below
  ``√eps · cost`` (the resolution the cost test is trusted with) is accepted on the model
  alone, so float32 does not spin on decreases it cannot resolve.
* A step that cannot lower the cost (the line search, or LM's damping, exhausted) ends that
  problem: with status ``"rounding floor"`` when its predicted decrease is below that
  resolution (the point is as good as the dtype allows; converged under ``tol=None``),
  ``"stalled"`` otherwise (not converged). ``FLAT_STEPS`` accepted steps in a row below the
  resolution that do not lower the gradient norm also end it at the ``"rounding floor"`` (an
  explicit ``tol`` below what the dtype resolves).

``LeastSquaresStats.status`` names what ended each sample: ``"gradient"``, ``"step"``,
``"rounding floor"``, ``"stalled"`` or ``"max_steps"``; a ConvergenceWarning lists the
samples that did not converge.

Through-iteration gradients (``Unroll``, ``Truncated(k)``, ``OneStep``): every step is a
differentiable map of x and of the tensors the residuals close over. The Jacobian, the weights
and the linear solve stay in the graph; the choices (the step size t of the line search, LM's
damping μ and whether it accepts, which problems have stopped) are made on values without
gradient and enter as constants. ``Unroll`` runs with gradient from the start; ``Truncated(k)``
solves without gradient, then replays the last k steps with gradient from the stored iterate
with the same choices, and returns the solver's values (bitwise) with the replay's gradient.
"""

from __future__ import annotations

from abc import abstractmethod
from collections import deque
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor

from implicit_ham._core.errors import ConvergenceWarning, NonFiniteError
from implicit_ham._core.events import events
from implicit_ham._core.state import State, with_gradient_of
from implicit_ham._core.stats import SolverStats
from implicit_ham._core.transforms import host_checks
from implicit_ham._core.validation import check_budget, check_tolerance
from implicit_ham.solvers.minimizers import MINIMIZERS, Minimizer, Objective, ReplaysSteps
from implicit_ham.solvers.robust import RobustLoss
from implicit_ham.solvers.sample_jacobian import (
    ResidualFn,
    check_independent,
    residuals_and_jacobian,
)

STATUSES = ("gradient", "step", "rounding floor", "stalled", "max_steps")
LINE_SEARCH_TRIES = 30
LM_REJECTIONS = 12
FLAT_STEPS = 3


@dataclass(frozen=True)
class SumOfSquares:
    """P independent least-squares problems on flat variables.

    Attributes:
        residuals: (P, n) -> (P, R); sample p must depend on x[p] only.
        rows: R, the residuals per problem.
        loss: the robust loss (``RobustLoss()``: the plain sum of squares).
        batch: B, the batch the statistics are reported over (P = B, or P = 1 for a coupled
            batch whose n = B · N variables are the B samples' in order).
        check_coupling: probe the first Jacobian for samples that depend on each other.
        where: the caller's name, for messages.
    """

    residuals: ResidualFn
    rows: int
    loss: RobustLoss = field(default_factory=RobustLoss)
    batch: int = 1
    check_coupling: bool = False
    where: str = "least_squares"


@dataclass
class Linearisation:
    """The problems linearised at x: residuals r (P, R), Jacobian (P, R, n), IRLS weights
    (P, R), cost (P,), gradient ``g = Jᵀ W r`` (P, n) and ``A = Jᵀ W J`` (P, n, n)."""

    r: Tensor
    jac: Tensor
    weights: Tensor
    cost: Tensor
    grad: Tensor
    gram: Tensor

    def detached(self) -> Linearisation:
        """The same values without graph."""
        return Linearisation(*(t.detach() for t in self.tensors()))

    def tensors(self) -> tuple[Tensor, ...]:
        return (self.r, self.jac, self.weights, self.cost, self.grad, self.gram)


def linearise(problem: SumOfSquares, x: Tensor) -> Linearisation:
    """The linearisation at x (P, n), differentiable when grad mode is on."""
    r, jac = residuals_and_jacobian(problem.residuals, x, problem.rows)
    weights = problem.loss.weights(r)
    weighted = jac * weights[..., None]
    grad = torch.einsum("pri,pr->pi", weighted, r)
    gram = torch.einsum("pri,prj->pij", weighted, jac)
    return Linearisation(r, jac, weights, problem.loss.cost(r), grad, gram)


def solve_normal(gram: Tensor, rhs: Tensor) -> Tensor:
    """(P, n): ``gram⁻¹ rhs`` per problem by Cholesky; the pseudo-inverse where a system is not
    positive definite (singular normal equations: a rank-deficient Jacobian, Tukey's zero
    weights). Differentiable."""
    chol, info = torch.linalg.cholesky_ex(gram)
    bad = info != 0
    if not bool(bad.any()):
        return torch.cholesky_solve(rhs[..., None], chol)[..., 0]
    eye = torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device)
    chol = torch.where(bad[:, None, None], eye, chol)  # no NaN from the failed factors
    solved = torch.cholesky_solve(rhs[..., None], chol)[..., 0]
    pinv = (torch.linalg.pinv(gram, hermitian=True) @ rhs[..., None])[..., 0]
    return torch.where(bad[:, None], pinv, solved)


@dataclass(frozen=True)
class Choice:
    """What one step decided without gradient: per problem, whether it moves (``move``, (P,)
    bool), its step size (``t``, (P,)) and the damping its direction used (``mu``, (P,); None
    for Gauss-Newton)."""

    move: Tensor
    t: Tensor
    mu: Tensor | None


@dataclass
class LeastSquaresStats(SolverStats):
    """``SolverStats`` with, per sample, ``status`` (what ended its solve, one of
    ``STATUSES``) and ``gradient_scale`` (B,): ``||J||_F ||√W r||`` (plus a floor for a zero
    residual) at the solution, the scale of the scaled gradient test (``least_squares``'
    implicit check divides by it)."""

    status: tuple[str, ...] = ()
    gradient_scale: Tensor | None = None


@dataclass
class _Progress:
    """The per-problem bookkeeping of a solve (all without gradient)."""

    active: Tensor
    converged: Tensor
    status: list[str]
    last_norm: Tensor
    flat: Tensor
    rows: list[Tensor] = field(default_factory=list)
    history: deque[tuple[Tensor, Choice]] = field(default_factory=deque)


class SumOfSquaresSolver(Minimizer, ReplaysSteps):
    """Base of the batched least-squares solvers (see the module docstring).

    A subclass gives ``_direction`` (the step direction, differentiable) and ``_choose`` (the
    step's choices, without gradient)."""

    max_steps: int
    tol: float | None
    rtol: float | None
    needs_residuals: ClassVar[bool] = True

    @abstractmethod
    def _direction(self, lin: Linearisation, mu: Tensor | None) -> Tensor:
        """(P, n): the step direction at ``lin`` (with damping mu where the solver has one)."""

    @abstractmethod
    def _choose(
        self, problem: SumOfSquares, x: Tensor, lin: Linearisation, delta: Tensor,
        state: dict[str, Tensor], active: Tensor,
    ) -> tuple[Choice, Tensor, Tensor]:
        """(choice, stalled (P,) bool, predicted decrease of the step tried (P,)) from detached
        values; updates ``state`` (the damping)."""

    @abstractmethod
    def _start(self, lin: Linearisation) -> dict[str, Tensor]:
        """The solver's per-problem state at the start (e.g. LM's μ)."""

    def minimize(self, objective: Objective, z0: State) -> tuple[State, SolverStats]:
        """The ``Minimizer`` entry point: the whole batch as one coupled problem."""
        return self.minimize_replaying(objective, z0, 0)

    def minimize_replaying(
        self, objective: Objective, z0: State, grad_steps: int
    ) -> tuple[State, SolverStats]:
        """``minimize`` with the last ``grad_steps`` steps carrying gradient."""
        assert objective.residuals is not None
        spec, fn = objective.spec, objective.residuals

        def flat(x: Tensor) -> Tensor:
            return fn(spec.unflatten(x.reshape(spec.batch, -1))).reshape(1, -1)

        x0 = spec.flatten(z0).reshape(1, -1)
        with torch.no_grad():
            rows = flat(x0.detach()).shape[1]
        problem = SumOfSquares(flat, rows, batch=spec.batch, where=self.name)
        x, stats = self.solve_sum_of_squares(problem, x0, grad_steps)
        return spec.unflatten(x.reshape(spec.batch, -1)), stats

    def solve_sum_of_squares(
        self, problem: SumOfSquares, x0: Tensor, grad_steps: int = 0
    ) -> tuple[Tensor, LeastSquaresStats]:
        """Solve the P problems from x0 (P, n); the last ``grad_steps`` steps carry gradient
        (all of them when ``grad_steps >= max_steps``)."""
        unroll = grad_steps >= self.max_steps and torch.is_grad_enabled()
        keep = 0 if unroll or not torch.is_grad_enabled() else min(grad_steps, self.max_steps)
        with torch.set_grad_enabled(unroll):
            x, progress, stats = self._run(problem, x0 if unroll else x0.detach(), keep)
        if keep and progress.history:
            z: Tensor | None = None
            with torch.enable_grad():
                for start, choice in progress.history:
                    z = self._apply(problem, start.detach() if z is None else z, choice)
            assert z is not None
            (x,) = with_gradient_of((x,), (z,))
        return x, stats

    def _apply(self, problem: SumOfSquares, x: Tensor, choice: Choice) -> Tensor:
        """One step with gradient, replayed with its recorded choices."""
        lin = linearise(problem, x)
        delta = self._direction(lin, choice.mu)
        return x + torch.where(choice.move[:, None], choice.t[:, None] * delta, 0.0)

    def _run(
        self, problem: SumOfSquares, x: Tensor, keep: int
    ) -> tuple[Tensor, _Progress, LeastSquaresStats]:
        lin = linearise(problem, x)
        if problem.check_coupling:
            check_independent(problem.residuals, x.detach(), problem.where)
        flat = lin.detached()
        first = self._norms(problem, flat.grad)
        self._check_finite(flat, 0)
        done = self._gradient_test(flat, x.detach())
        progress = _Progress(
            active=~done,
            converged=done.clone(),
            status=["gradient" if d else "max_steps" for d in done.tolist()],
            last_norm=torch.linalg.vector_norm(flat.grad, dim=1),
            flat=torch.zeros_like(done, dtype=torch.int64),
            history=deque(maxlen=max(keep, 1)),
        )
        state = self._start(flat)
        steps = 0
        for _ in range(self.max_steps):
            if not bool(progress.active.any()):
                break
            steps += 1
            delta = self._direction(lin, state.get("mu"))
            with torch.no_grad():
                choice, stalled, predicted = self._choose(
                    problem, x.detach(), flat, delta.detach(), state, progress.active
                )
            if keep:
                progress.history.append((x.detach(), choice))
            moved = bool(choice.move.any())
            if moved:
                x = x + torch.where(choice.move[:, None], choice.t[:, None] * delta, 0.0)
                lin = linearise(problem, x)
                flat = lin.detached()
                self._check_finite(flat, steps)
            with torch.no_grad():
                step = choice.t[:, None] * delta.detach()
                self._after_step(flat, x.detach(), step, choice.move, stalled, predicted, progress)
            progress.rows.append(self._norms(problem, flat.grad))
        return x, progress, self._stats(problem, first, steps, progress, flat, x.detach())

    def _gradient_test(self, lin: Linearisation, x: Tensor) -> Tensor:
        """(P,) bool: the gradient test (absolute ``tol``, or scaled by ``rtol``)."""
        norm = torch.linalg.vector_norm(lin.grad, dim=1)
        if self.tol is not None:
            return norm <= self.tol
        return norm <= self._rtol(x.dtype) * _gradient_scale(lin, x)

    def _after_step(
        self, lin: Linearisation, x: Tensor, step: Tensor, moved: Tensor, stalled: Tensor,
        predicted: Tensor, progress: _Progress,
    ) -> None:
        """Apply the stopping tests to the problems that took a step or stalled."""
        active = progress.active
        met = self._gradient_test(lin, x) & moved & active
        reason = {"gradient": met}
        if self.tol is None:
            rtol = self._rtol(x.dtype)
            small = torch.linalg.vector_norm(step, dim=1) <= rtol * (
                rtol + torch.linalg.vector_norm(x, dim=1)
            )
            reason["step"] = small & moved & active & ~met
        # at the rounding floor: no step is accepted, or accepted steps whose predicted
        # decrease the cost cannot resolve stop shrinking the gradient (FLAT_STEPS in a row)
        unresolved = predicted <= _resolution(lin.cost)
        norm = torch.linalg.vector_norm(lin.grad, dim=1)
        flat = moved & active & unresolved & (norm >= progress.last_norm)
        progress.flat = torch.where(flat, progress.flat + 1, torch.zeros_like(progress.flat))
        progress.last_norm = torch.where(moved, norm, progress.last_norm)
        stuck = (progress.flat >= FLAT_STEPS) & ~met
        at_floor = active & ((stalled & unresolved) | stuck)
        reason["rounding floor"] = at_floor
        reason["stalled"] = stalled & active & ~at_floor
        for name, mask in reason.items():
            if not bool(mask.any()):
                continue
            for p in mask.nonzero()[:, 0].tolist():
                progress.status[p] = name
            progress.active = progress.active & ~mask
            counts = name != "stalled" and (name != "rounding floor" or self.tol is None)
            if counts:
                progress.converged = progress.converged | mask

    def _stats(
        self,
        problem: SumOfSquares,
        first: Tensor,
        steps: int,
        progress: _Progress,
        lin: Linearisation,
        x: Tensor,
    ) -> LeastSquaresStats:
        trace = torch.stack(progress.rows) if progress.rows else first.new_zeros(0, len(first))
        last = progress.rows[-1] if progress.rows else first
        rel = last / (first + torch.finfo(last.dtype).tiny)
        repeat = problem.batch // lin.cost.shape[0]
        converged = progress.converged.repeat_interleave(repeat)
        status = tuple(s for s in progress.status for _ in range(repeat))
        scale = _gradient_scale(lin, x).repeat_interleave(repeat)
        stats = LeastSquaresStats(
            self.name, steps, trace, last, rel, converged, status=status, gradient_scale=scale
        )
        if host_checks() and not bool(converged.all()):
            missed = sorted({s for s, c in zip(status, converged.tolist(), strict=True) if not c})
            worst = float(last.max())
            events().warn(
                f"{self.name}: {int((~converged).sum())} of {len(status)} samples did not "
                f"converge in {steps} steps ({', '.join(missed)}; worst gradient norm "
                f"{worst:.3e}). 'stalled': no step lowers the cost (check the residuals' "
                "scale or use float64); 'max_steps': raise max_steps; 'rounding floor' "
                "with an explicit tol: that tol is below what the dtype resolves.",
                ConvergenceWarning,
                residual=worst,
                where=self.name,
            )
        return stats

    def _rtol(self, dtype: torch.dtype) -> float:
        return self.rtol if self.rtol is not None else torch.finfo(dtype).eps ** (2 / 3)

    @staticmethod
    def _norms(problem: SumOfSquares, grad: Tensor) -> Tensor:
        """(B,): each sample's gradient norm."""
        return torch.linalg.vector_norm(grad.reshape(problem.batch, -1), dim=1)

    def _check_finite(self, lin: Linearisation, step: int) -> None:
        finite = torch.isfinite(lin.grad).all() & torch.isfinite(lin.cost).all()
        if host_checks() and not bool(finite):
            where = "the initial state z0" if step == 0 else f"step {step}"
            raise NonFiniteError(
                f"{self.name}: non-finite residuals or Jacobian (NaN or inf) at {where}. Check "
                "the residuals for overflow, start closer, or use float64."
            )


def _gradient_scale(lin: Linearisation, x: Tensor) -> Tensor:
    """(P,): ``||J||_F (||√W r|| + √eps ||J||_F (1 + ||x||))``. Its first term bounds
    ``||Jᵀ W r||`` (their ratio is a cosine); the second keeps the ratio finite at a zero
    residual, where ``||Jᵀ W r|| ≈ ||Jᵀ J δx||`` measures the error δx relative to x."""
    jac_norm = torch.linalg.vector_norm(lin.jac, dim=(1, 2))
    floor = torch.finfo(x.dtype).eps ** 0.5 * jac_norm * (1 + torch.linalg.vector_norm(x, dim=1))
    return jac_norm * (torch.linalg.vector_norm(lin.weights.sqrt() * lin.r, dim=1) + floor)


def _resolution(cost: Tensor) -> Tensor:
    """(P,): ``√eps · cost``, the smallest predicted decrease the cost test is trusted with (the
    cost's rounding grows with the size of the terms the residuals subtract, which it does not
    see); a step predicted to gain less is accepted on the model alone."""
    return torch.finfo(cost.dtype).eps ** 0.5 * cost.abs() + torch.finfo(cost.dtype).tiny


def _floor(cost: Tensor) -> Tensor:
    """(P,): the rounding error of a cost: what acceptance tests tolerate as no change."""
    return 16 * torch.finfo(cost.dtype).eps * cost.abs() + torch.finfo(cost.dtype).tiny


@MINIMIZERS.register("gauss_newton")
@dataclass(frozen=True)
class GaussNewton(SumOfSquaresSolver):
    """Gauss-Newton: ``(Jᵀ W J) Δ = -Jᵀ W r`` per problem, then a backtracking (Armijo) line
    search ``t = 1, 1/2, ...`` per problem (``LINE_SEARCH_TRIES`` tries) whose sufficient
    decrease is compared with the cost's rounding floor.

    Args:
        max_steps: iterations. tol: stop when ``||Jᵀ W r|| <= tol`` (absolute); None (default):
            the dtype-scaled tests of the module docstring. rtol: their level (default
            ``sqrt(eps)`` of the dtype).
    """

    max_steps: int = 50
    tol: float | None = None
    rtol: float | None = None

    def __post_init__(self) -> None:
        check_budget("GaussNewton", self.max_steps, self.tol)
        check_tolerance("GaussNewton", "rtol", self.rtol, optional=True)

    def _start(self, lin: Linearisation) -> dict[str, Tensor]:
        return {}

    def _direction(self, lin: Linearisation, mu: Tensor | None) -> Tensor:
        return solve_normal(lin.gram, -lin.grad)

    def _choose(
        self, problem: SumOfSquares, x: Tensor, lin: Linearisation, delta: Tensor,
        state: dict[str, Tensor], active: Tensor,
    ) -> tuple[Choice, Tensor, Tensor]:
        slope = (lin.grad * delta).sum(1)  # <= 0 for a descent direction
        floor, resolution = _floor(lin.cost), _resolution(lin.cost)
        predicted = -0.5 * slope  # the Gauss-Newton model's decrease ½ gᵀ A⁻¹ g
        t = torch.ones_like(lin.cost)
        pending, accepted = active.clone(), torch.zeros_like(active)
        for _ in range(LINE_SEARCH_TRIES):
            cost = problem.loss.cost(problem.residuals(x + t[:, None] * delta))
            model_only = t * predicted <= resolution  # too small for the cost to resolve
            ok = pending & ((cost <= lin.cost + 1e-4 * t * slope + floor) | model_only)
            accepted, pending = accepted | ok, pending & ~ok
            if not bool(pending.any()):
                break
            t = torch.where(pending, t / 2, t)
        stalled = active & ~accepted
        return Choice(accepted, t, None), stalled, predicted


@MINIMIZERS.register("levenberg_marquardt")
@dataclass(frozen=True)
class LevenbergMarquardt(SumOfSquaresSolver):
    """Levenberg-Marquardt: ``(Jᵀ W J + μ I) Δ = -Jᵀ W r`` per problem, μ adapted per problem
    by the gain ratio ρ (μ / 3 for ρ > 0.75, 2 μ for ρ < 0.25: piecewise constant, so the
    damping is locally a constant of the unrolled steps); a rejected step raises μ by ν (ν
    doubling while rejections go on), ``LM_REJECTIONS`` rejections
    in a row end the problem (status "rounding floor" or "stalled"). Steps whose cost change
    is within the rounding floor are accepted.

    Args:
        max_steps: iterations (accepted or rejected). tol, rtol: as for ``GaussNewton``.
        mu0: the initial damping, relative to ``max diag(Jᵀ W J)`` of each problem.
    """

    max_steps: int = 100
    tol: float | None = None
    rtol: float | None = None
    mu0: float = 1e-3

    def __post_init__(self) -> None:
        check_budget("LevenbergMarquardt", self.max_steps, self.tol)
        check_tolerance("LevenbergMarquardt", "rtol", self.rtol, optional=True)
        check_tolerance("LevenbergMarquardt", "mu0", self.mu0)

    def _start(self, lin: Linearisation) -> dict[str, Tensor]:
        top = lin.gram.diagonal(dim1=1, dim2=2).amax(1)
        mu = self.mu0 * top.clamp_min(torch.finfo(top.dtype).tiny)
        return {"mu": mu, "nu": torch.full_like(mu, 2.0), "rejected": torch.zeros_like(mu)}

    def _direction(self, lin: Linearisation, mu: Tensor | None) -> Tensor:
        assert mu is not None
        eye = torch.eye(lin.gram.shape[-1], dtype=lin.gram.dtype, device=lin.gram.device)
        return solve_normal(lin.gram + mu[:, None, None] * eye, -lin.grad)

    def _choose(
        self, problem: SumOfSquares, x: Tensor, lin: Linearisation, delta: Tensor,
        state: dict[str, Tensor], active: Tensor,
    ) -> tuple[Choice, Tensor, Tensor]:
        mu, nu, rejected = state["mu"], state["nu"], state["rejected"]
        cost = problem.loss.cost(problem.residuals(x + delta))
        actual = lin.cost - cost
        predicted = 0.5 * (delta * (mu[:, None] * delta - lin.grad)).sum(1)
        resolved = actual >= -_floor(lin.cost)
        ok = active & (predicted > 0) & (resolved | (predicted <= _resolution(lin.cost)))
        gain = actual / predicted.clamp_min(torch.finfo(mu.dtype).tiny)
        # piecewise constant in the gain: the damping is a constant of the unrolled steps
        shrink = torch.where(gain > 0.75, 1 / 3, torch.where(gain < 0.25, 2.0, 1.0))
        rejected = torch.where(ok, 0.0, rejected + active.to(mu.dtype))
        stalled = active & ~ok & (rejected >= LM_REJECTIONS)
        state["mu"] = torch.where(ok, mu * shrink, torch.where(active, mu * nu, mu))
        state["nu"] = torch.where(ok, 2.0, torch.where(active, 2 * nu, nu))
        state["rejected"] = rejected
        return Choice(ok, torch.ones_like(mu), mu.clone()), stalled, predicted.abs()
