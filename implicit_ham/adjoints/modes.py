"""Backward modes: how the gradient of a fixed-point solution is computed.

A backward mode never changes the forward value, only the gradient. Two families:

* through iterations (autograd over trailing iterations of the forward solve): ``Unroll`` (all K
  steps, BPTT), ``Truncated(k)`` (the last k), ``OneStep`` (the last one; Hamburger's / JFB's
  gradient); ``k`` larger than the solver's ``max_steps`` is clipped (all steps carry gradient);
* after the solve: ``Phantom(k, tau)`` (k damped steps ``p <- tau f(p) + (1 - tau) p`` from the
  solution carry the gradient, the value stays the solution);
* at the fixed point (``autograd.Function`` around z*, memory flat in K): ``Implicit`` (solve
  ``g = J^T g + v`` with a chosen linear solver) and ``Neumann(k, tau)`` (the truncated Neumann
  series ``g = tau * sum_{i<k} B^T^i v`` with ``B = tau J + (1 - tau) I``). Both assume z* is a
  fixed point and check it: see ``fixed_point_tol``.
"""

from __future__ import annotations

import dataclasses
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import Tensor

from implicit_ham._core.registry import Registry
from implicit_ham._core.state import State, StateSpec, StepFn, detached, with_gradient_of
from implicit_ham._core.stats import BackwardStats, SolverStats
from implicit_ham._core.transforms import host_checks
from implicit_ham._core.validation import (
    check_choice,
    check_nonnegative,
    check_positive_int,
    check_tolerance,
    check_unit_interval,
)
from implicit_ham.adjoints.adjoint_system import Attachment
from implicit_ham.adjoints.backward_check import SolvePolicy, SolveRecord, finish_backward
from implicit_ham.adjoints.fixed_point_check import ON_DIVERGENCE, FixedPointCheck
from implicit_ham.adjoints.implicit_backward import attach_fixed_point_gradient
from implicit_ham.adjoints.second_order import SecondOrder
from implicit_ham.linalg.dense import Dense
from implicit_ham.linalg.operator import (
    LINEAR_SOLVERS,
    AdjointOperator,
    LinearSolver,
    discounted,
    relative_residual,
    row_scales,
    scaled,
)
from implicit_ham.solvers.base import FixedPointSolver, ReplaysIterates, apply_steps, damped

logger = logging.getLogger(__name__)
ADJOINTS: Registry[Adjoint] = Registry("adjoint")
make_adjoint = ADJOINTS.make_function("make_adjoint", __name__)
register_adjoint = ADJOINTS.register_function("register_adjoint", __name__)


class Adjoint(ABC):
    """A backward mode (a small frozen dataclass in every concrete case)."""

    @abstractmethod
    def run(
        self, f: StepFn, z0: State, spec: StateSpec, solver: FixedPointSolver
    ) -> tuple[State, SolverStats, list[BackwardStats]]:
        """Solve with ``solver`` and return (value carrying this mode's gradient, forward
        statistics, a list that each backward pass appends its statistics to)."""

    @property
    def name(self) -> str:
        """The registry name of this backward mode."""
        return ADJOINTS.name_of(self) or type(self).__name__

    @property
    def readout_step_only(self) -> bool:
        """Whether this mode's whole gradient is one differentiable step at the solution, which
        a layer with a differentiable readout step may take itself: it then solves without
        graph, detaches the solution and differentiates only its readout (Hamburger's one-step
        gradient: bases detached, one coefficient step). False here; ``OneStep``: True."""
        return False


class ThroughIterations(Adjoint):
    """Base of the modes that backpropagate through trailing iterations of the solver itself."""

    @abstractmethod
    def grad_steps(self, solver: FixedPointSolver) -> int:
        """How many trailing iterations carry gradient."""

    def run(
        self, f: StepFn, z0: State, spec: StateSpec, solver: FixedPointSolver
    ) -> tuple[State, SolverStats, list[BackwardStats]]:
        z, stats = solve_through_iterations(solver, f, z0, spec, self.grad_steps(solver))
        return z, stats, []


def solve_through_iterations(
    solver: FixedPointSolver, f: StepFn, z0: State, spec: StateSpec, grad_steps: int
) -> tuple[State, SolverStats]:
    """Solve with the last ``grad_steps`` steps of ``f`` carrying gradient.

    A solver that declares ``ReplaysIterates`` (``FixedPointIteration``) runs its own last
    ``grad_steps`` iterations with gradient. Any other solver only finds z*; the gradient is
    then that of ``grad_steps`` plain steps of ``f`` taken from z* (detached), attached without
    changing the value (``with_gradient_of``), and ``Unroll`` (``grad_steps >= max_steps``)
    is refused: its iterations are not plain steps of ``f``.
    """
    if isinstance(solver, ReplaysIterates):
        return solver.solve_replaying(f, z0, spec, grad_steps)
    if grad_steps >= solver.max_steps:
        raise ValueError(
            f"{type(solver).__name__} runs without gradient and cannot be unrolled through all "
            f"{solver.max_steps} steps; use FixedPointIteration with Unroll, or an adjoint with "
            "fewer gradient steps (Truncated, OneStep, Phantom, Implicit, Neumann)."
        )
    z, stats = solver.solve(f, z0, spec)
    if grad_steps == 0 or not torch.is_grad_enabled():
        return z, stats
    return with_gradient_of(z, apply_steps(f, detached(z), grad_steps)), stats


@ADJOINTS.register("unroll")
@dataclass(frozen=True)
class Unroll(ThroughIterations):
    """Backpropagation through every iteration (BPTT). Memory grows linearly in K; the only
    mode in which the initial state z0 receives a gradient."""

    def grad_steps(self, solver: FixedPointSolver) -> int:
        return solver.max_steps


@ADJOINTS.register("truncated")
@dataclass(frozen=True)
class Truncated(ThroughIterations):
    """The last ``k`` iterations carry gradient; the earlier ones run without it."""

    k: int = 1

    def __post_init__(self) -> None:
        check_positive_int("Truncated", "k", self.k)

    def grad_steps(self, solver: FixedPointSolver) -> int:
        return self.k


@ADJOINTS.register("one_step")
@dataclass(frozen=True)
class OneStep(ThroughIterations):
    """Only the last iteration carries gradient: ``Truncated(1)``, the one-step / JFB gradient."""

    def grad_steps(self, solver: FixedPointSolver) -> int:
        return 1

    @property
    def readout_step_only(self) -> bool:
        """True: a layer's readout step may be the one step (see ``Adjoint``)."""
        return True


@ADJOINTS.register("phantom")
@dataclass(frozen=True)
class Phantom(Adjoint):
    """Unrolling-based phantom gradient (Geng et al., NeurIPS 2021): after the solve (without
    gradient), ``k`` damped steps ``p <- tau f(p) + (1 - tau) p`` from the solution z* carry the
    gradient; the value stays the solver's z* (``value = z* + (p - p.detach())``). The k steps
    are extra evaluations of ``f``, spent for the gradient only. ``k = 1, tau = 1`` is the
    one-step (JFB) gradient at z*."""

    k: int = 5
    tau: float = 0.5

    def __post_init__(self) -> None:
        check_positive_int("Phantom", "k", self.k)
        check_unit_interval("Phantom", "tau", self.tau)

    def run(
        self, f: StepFn, z0: State, spec: StateSpec, solver: FixedPointSolver
    ) -> tuple[State, SolverStats, list[BackwardStats]]:
        with torch.no_grad():
            z, stats = solver.solve(f, z0, spec)
        if not torch.is_grad_enabled():
            return z, stats, []
        step, p = damped(f, self.tau), detached(z)  # detached: no forward-mode tangent either
        for _ in range(self.k):
            p = step(p)
        return with_gradient_of(z, p), stats, []


class AtFixedPoint(Adjoint):
    """Base of the modes that differentiate at the solution z* (memory flat in K).

    Subclasses are dataclasses with the fields ``fixed_point_tol`` (the largest relative
    residual ``||f(z*) - z*|| / ||f(z*)||`` at which z* counts as a fixed point; None: no
    check) and ``on_divergence`` (what a failed check or solve does: "warn", "raise",
    "fallback" to the one-step gradient).
    """

    fixed_point_tol: float | None = 1e-3
    on_divergence: str = "warn"

    @abstractmethod
    def backward_solve(self, op: AdjointOperator, v: Tensor) -> tuple[Tensor, BackwardStats]:
        """Map the incoming gradient v (M,) to the adjoint vector g (M,) fed to ``f``'s graph."""

    def second_order(self) -> SecondOrder | None:
        """How ``create_graph=True`` differentiates ``backward_solve`` (see
        ``implicit_ham.adjoints.second_order``); None (the default) refuses with
        ``SecondOrderError``."""
        return None

    def run(
        self, f: StepFn, z0: State, spec: StateSpec, solver: FixedPointSolver
    ) -> tuple[State, SolverStats, list[BackwardStats]]:
        with torch.no_grad():
            z, stats = solver.solve(f, z0, spec)
        log: list[BackwardStats] = []
        check = FixedPointCheck(self.name, self.fixed_point_tol, self.on_divergence)
        setup = Attachment(spec, self.backward_solve, log, check, self.second_order())
        value = attach_fixed_point_gradient(f, z, setup)
        return value, stats, log


@dataclass(frozen=True)
class _Attempt:
    """One linear solve of a backward pass: the solver, the system it solved (row-scaled by
    ``scale`` (M,) or not), its answer ``g`` in that system's coordinates, its products and
    its κ (exact or a bound, as the solver says)."""

    solver: LinearSolver
    system: AdjointOperator
    rhs: Tensor
    scale: Tensor | None
    g: Tensor
    steps: int
    cond: float | None

    def unscaled(self) -> Tensor:
        """(M,) the answer in the unscaled system's coordinates."""
        return self.g if self.scale is None else self.g * self.scale.rsqrt()


@ADJOINTS.register("implicit")
@dataclass(frozen=True)
class Implicit(AtFixedPoint):
    """Implicit differentiation: solve ``g = J^T g + v`` at z*, then ``grad = (df/dθ)^T g``.

    Args:
        linear_solver: a ``LinearSolver`` or its name ("auto", "gmres", "cg", "fixed_point",
            "anderson", "broyden", "dense"). The default ``Auto()`` solves small systems
            densely (at most 128 unknowns, or 32 per sample as B blocks; exact, with exact κ)
            and larger ones by scaled GMRES (``implicit_ham.linalg.auto``); an explicit
            choice is used as given.
        max_steps: budget of VJPs for the linear solve.
        tol: target relative residual ``||g - J^T g - v|| / ||v||`` (of the scaled system
            ``D^-1/2 (I - J^T) D^-1/2`` for a scaled Krylov solve, see ``scaling``).
        on_divergence: when z* is not a fixed point (see ``fixed_point_tol``), or the solve
            misses ``tol`` or returns a non-finite adjoint: "warn" (default; a non-finite
            adjoint still raises), "raise" (``NotFixedPointError`` / ``BackwardSolveError``), or
            "fallback" (warn and use the one-step gradient g = v for this backward; the stats
            say ``fallback=True``).
        fixed_point_tol: the largest relative residual ``||f(z*) - z*|| / ||f(z*)||`` (worst
            sample, measured on the evaluation of ``f`` this mode makes anyway) at which z*
            counts as a fixed point; above it the implicit gradient is wrong and
            ``on_divergence`` applies. None disables the check.
        cond_threshold: warn ``ConditioningWarning`` when the linear solver reports κ(I - J)
            above this (Dense: exact, ``BackwardStats.cond``; GMRES: a lower bound from its
            Arnoldi matrices, ``BackwardStats.cond_lower_bound``, with ``cond=None``: κ
            unknown); None disables the check.
        ridge: λ >= 0. With λ > 0 the solve is ``g = J^T g / (1 + λ) + v`` (the Neumann series
            discounted by ``1 / (1 + λ)`` per term): a biased gradient between the implicit one
            (λ = 0) and the one-step one (λ -> inf), for iterations whose ``I - J`` is
            (near-)singular, such as NMF's. If J's spectral radius is ρ <= 1, the system's
            eigenvalues are at least ``1 - ρ / (1 + λ)`` away from zero. Tolerance, residual and
            κ then refer to the regularised system ``I - J / (1 + λ)``.
        scaling: hand a Krylov solver (GMRES, CG, ``PerSampleCG``: ``scalable``) the
            symmetrically scaled system ``D^-1/2 A^T D^-1/2``, D equilibrating the rows of
            ``A^T`` (up to three Ruiz sweeps of row norms estimated from 4 fixed Rademacher
            probes, ``linalg.operator.row_scales``: 4 more products for a well-scaled system,
            which is then solved unscaled; 12 at most), as MINPACK scales variables: its
            residual then weighs every equation by its own size, so a small residual can no
            longer hide the small rows of an
            ill-scaled system. ``tol`` and the residuals in the stats refer to the scaled
            system. False: the unscaled system.
    """

    linear_solver: LinearSolver | str = "auto"
    max_steps: int = 100
    tol: float = 1e-5
    on_divergence: str = "warn"
    cond_threshold: float | None = 1e6
    ridge: float = 0.0
    fixed_point_tol: float | None = 1e-3
    scaling: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "linear_solver", LINEAR_SOLVERS.resolve(self.linear_solver, LinearSolver)
        )
        check_positive_int("Implicit", "max_steps", self.max_steps)
        check_tolerance("Implicit", "tol", self.tol)
        check_choice("Implicit", "on_divergence", self.on_divergence, ON_DIVERGENCE)
        check_tolerance("Implicit", "fixed_point_tol", self.fixed_point_tol, optional=True)
        check_tolerance("Implicit", "cond_threshold", self.cond_threshold, optional=True)
        check_nonnegative("Implicit", "ridge", self.ridge, "the exact implicit gradient")

    def second_order(self) -> SecondOrder:
        """The adjoint vector is differentiated implicitly: its own gradient solves the
        transposed system with the same linear solver (``ridge`` is already in the system)."""
        transposed = dataclasses.replace(self, ridge=0.0, cond_threshold=None)
        vmappable = not self.linear_solver.iterative  # type: ignore[union-attr]
        return SecondOrder(
            "solve", transposed.backward_solve, 1.0 / (1.0 + self.ridge), vmappable
        )

    def backward_solve(self, op: AdjointOperator, v: Tensor) -> tuple[Tensor, BackwardStats]:
        """Try ``linear_solver.choices(op)`` in turn (scaled where ``scaling`` applies) until
        one answer meets ``tol`` on the unscaled system; keep the answer with the smallest
        unscaled residual (a dense answer that missed ``tol`` in a low precision beats a
        GMRES one that missed it further); check it (``finish_backward``) with the exact κ
        of the last dense attempt, if any, and GMRES's bound. Where no host check can run
        (``torch.compile``) only ``linear_solver.traced_choice(op)`` is used."""
        solver: LinearSolver = self.linear_solver  # type: ignore[assignment]
        if self.ridge:
            op = discounted(op, 1.0 / (1.0 + self.ridge))
        checks = host_checks()
        if checks and not bool(v.any()):
            return self._finish(op, v, torch.zeros_like(v), SolveRecord(solver.name, 0))
        choices = solver.choices(op) if checks else (solver.traced_choice(op),)
        steps, exact = 0, None
        best: tuple[float, _Attempt] | None = None
        for chosen in choices:
            attempt = self._attempt(chosen, op, v, checks)
            steps += attempt.steps
            done = len(choices) == 1
            if not done:
                steps += 1  # the unscaled residual's product
                residual = relative_residual(op, v, attempt.unscaled())
                done = residual <= self.tol
                if best is None or residual < best[0]:
                    best = (residual, attempt)
            # κ of op itself (dense solvers are never scaled); per-sample blocks' κ is the
            # system's only when their answer solves it (the samples are independent)
            exact_cond = attempt.cond is not None and not chosen.cond_is_bound
            if exact_cond and (done or type(chosen) is Dense):
                exact = attempt.cond
            if done:
                break
            logger.debug("Implicit: %s missed tol=%g; next solver", chosen.name, self.tol)
        kept = attempt if best is None else best[1]
        name = solver.name if kept.solver is solver else f"{solver.name}:{kept.solver.name}"
        bound = kept.cond if kept.solver.cond_is_bound else None
        record = SolveRecord(name, steps, exact, bound, op.label, kept.solver.requires_spd)
        g, stats = self._finish(kept.system, kept.rhs, kept.g, record)
        if kept.scale is None:
            return g, stats
        return (v.clone() if stats.fallback else g * kept.scale.rsqrt()), stats

    def _attempt(
        self, chosen: LinearSolver, op: AdjointOperator, v: Tensor, checks: bool
    ) -> _Attempt:
        """One linear solve of ``op`` by ``chosen``, on the row-scaled system where
        ``scaling`` applies to it."""
        system, rhs, scale, probes = op, v, None, 0
        if self.scaling and chosen.scalable and checks:
            scale, probes = row_scales(op, v.dtype, v.device)
            if scale is not None:
                system, rhs = scaled(op, scale), v * scale.rsqrt()
        g, used, cond = chosen.solve(system, rhs, self.max_steps, self.tol)
        return _Attempt(chosen, system, rhs, scale, g, probes + used, cond)

    def _finish(
        self, system: AdjointOperator, rhs: Tensor, g: Tensor, record: SolveRecord
    ) -> tuple[Tensor, BackwardStats]:
        """``finish_backward`` on the system solved (``A^T g = rhs``) under this mode's policy."""
        policy = SolvePolicy(self.name, self.tol, self.on_divergence, self.cond_threshold)
        return finish_backward(system, rhs, g, policy, record).pair()


@ADJOINTS.register("neumann")
@dataclass(frozen=True)
class Neumann(AtFixedPoint):
    """Neumann-series phantom gradient: ``g = tau * sum_{i<k} (B^T)^i v``,
    ``B = tau J + (1 - tau) I``; ``k -> inf`` recovers ``Implicit``.

    Args:
        k, tau: the number of terms and the damping.
        fixed_point_tol, on_divergence: the fixed-point check, as for ``Implicit``.
    """

    k: int = 5
    tau: float = 0.5
    fixed_point_tol: float | None = 1e-3
    on_divergence: str = "warn"

    def __post_init__(self) -> None:
        check_positive_int("Neumann", "k", self.k)
        check_unit_interval("Neumann", "tau", self.tau)
        check_tolerance("Neumann", "fixed_point_tol", self.fixed_point_tol, optional=True)
        check_choice("Neumann", "on_divergence", self.on_divergence, ON_DIVERGENCE)

    def second_order(self) -> SecondOrder:
        """The k-term series is differentiated as computed (its products carry a graph)."""
        return SecondOrder("series", vmappable=True)

    def backward_solve(self, op: AdjointOperator, v: Tensor) -> tuple[Tensor, BackwardStats]:
        term, total, plain = v, v, self.tau == 1.0  # plain: the undamped series, no scalings
        for _ in range(self.k - 1):
            product = op.vjp(term)
            term = product if plain else self.tau * product + (1 - self.tau) * term
            total = total + term
        g = total if plain else self.tau * total
        policy = SolvePolicy(self.name, None, self.on_divergence)
        record = SolveRecord("neumann_series", self.k - 1)
        return finish_backward(op, v, g, policy, record).pair()

