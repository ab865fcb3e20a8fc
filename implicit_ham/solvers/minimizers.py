"""Forward solvers of ``minimize`` / ``least_squares``: find ``argmin_z loss(z)``.

Every minimizer shares ``minimize(objective, z0, spec, grad_steps) -> (z, SolverStats)``; the
stats' residuals are ``||grad_z loss||`` per sample after each step (for ``GradientDescent``
under a constraint, the projected-gradient mapping ``||z - P(z - lr grad)|| / lr``),
``rel_residual`` the same relative to its value at z0, ``converged`` the residual ``<= tol``.

* ``GradientDescent(lr)``: ``z <- P(z - lr grad)`` (P the constraint's projection, identity
  without one), run by ``FixedPointIteration``: its steps are plain maps, so ``Unroll`` /
  ``Truncated`` / ``OneStep`` differentiate them and the value never depends on the mode.
* ``LBFGS``, ``NewtonCG``: in ``quasi_newton`` (per-sample line searches and stopping).
* ``GaussNewton``, ``LevenbergMarquardt``: for a sum of squares ``½||r(z)||²``
  (``least_squares`` only); they live in ``implicit_ham.solvers.least_squares``.

``LBFGS`` and ``NewtonCG`` refuse the through-iteration modes (ValueError): their steps
(line searches, inner solves) are not differentiable maps; use ``Implicit``.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from implicit_ham._core.registry import Registry
from implicit_ham._core.state import State, StateSpec
from implicit_ham._core.stats import SolverStats
from implicit_ham._core.transforms import active_transforms
from implicit_ham._core.validation import check_budget, check_tolerance
from implicit_ham.solvers.base import ResidualTrace
from implicit_ham.solvers.iteration import FixedPointIteration
from implicit_ham.solvers.projections import Constraint

MINIMIZERS: Registry[Minimizer] = Registry("minimizer")
make_minimizer = MINIMIZERS.make_function("make_minimizer", __name__)
register_minimizer = MINIMIZERS.register_function("register_minimizer", __name__)


@dataclass(frozen=True)
class Objective:
    """``loss(z)`` on the state, with the derivatives the minimizers need.

    Attributes:
        loss: state (tuple) -> scalar Tensor, or (B,) per-sample losses (summed).
        spec: the state's structure.
        residuals: for a sum of squares, state -> residual vector r with ``loss = ½||r||²``;
            None otherwise.
        constraint: the feasible set (projected gradient only), or None.
        batch_coupled: whether the samples form one problem (True) or B independent ones
            (``loss`` the sum of per-sample losses, or their (B,) vector); the line-search
            minimizers then solve each sample on its own.
    """

    loss: Callable[[State], Tensor]
    spec: StateSpec
    residuals: Callable[[State], Tensor] | None = None
    constraint: Constraint | None = None
    batch_coupled: bool = True

    def flat(self, z: State) -> Tensor:
        """(M,): the whole state as one vector."""
        return self.spec.flatten(z).reshape(-1)

    def state(self, x: Tensor) -> State:
        """Inverse of ``flat``."""
        return self.spec.unflatten(x)

    def value(self, x: Tensor) -> Tensor:
        """The loss at the flat point x (a scalar: the sum of per-sample losses)."""
        return self.loss(self.state(x)).sum()

    def gradient(self, z: State) -> State:
        """``grad_z loss`` at z; differentiable (``create_graph``) when grad mode is on, so
        through-iteration modes and the implicit backward can differentiate it again."""
        if active_transforms():  # torch.func cannot trace torch.autograd.grad: its own grad
            return self.spec.unflatten(_func_gradient(self, self.spec.flatten(z)))
        create = torch.is_grad_enabled()
        with torch.enable_grad():
            zr = tuple(t if t.requires_grad else t.detach().requires_grad_() for t in z)
            value = self.loss(zr)
            total = value if value.ndim == 0 else value.sum()
            grads = torch.autograd.grad(total, zr, create_graph=create, allow_unused=True)
        out = self.spec.zeros_like_missing(grads, zr)
        return out if create else tuple(t.detach() for t in out)

    def flat_gradient(self, x: Tensor) -> Tensor:
        """(M,): ``grad loss`` at x, without graph."""
        with torch.no_grad():
            return self.flat(self.gradient(self.state(x)))

    def hvp(self, x: Tensor) -> Callable[[Tensor], Tensor]:
        """``v -> H v`` at x (double backward; H symmetric), without graph."""
        if active_transforms():
            return lambda v: torch.func.jvp(lambda y: _func_gradient(self, y), (x,), (v,))[1]
        with torch.enable_grad():
            xr = x.detach().requires_grad_()
            (grad,) = torch.autograd.grad(self.value(xr), xr, create_graph=True)

        def product(v: Tensor) -> Tensor:
            (hv,) = torch.autograd.grad(grad, xr, v, retain_graph=True, allow_unused=True)
            return torch.zeros_like(v) if hv is None else hv.detach()

        return product

    def residual_jacobian(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(r (R,), dr/dx (R, M)) at x, dense (``torch.func.jacrev``), without graph."""
        assert self.residuals is not None
        fn = self.residuals

        def flat_r(y: Tensor) -> Tensor:
            return fn(self.state(y)).reshape(-1)

        with torch.no_grad():
            jac = torch.func.jacrev(flat_r)(x)
            return flat_r(x), jac


def _func_gradient(objective: Objective, x: Tensor) -> Tensor:
    """``grad loss`` at the flat x (any shape) by ``torch.func.grad``: composes with the
    torch.func transforms around the solve (``grad`` / ``vjp`` / ``jacrev`` of the layer)."""
    return torch.func.grad(lambda y: objective.value(y))(x).reshape(x.shape)


class Minimizer(ABC):
    """A forward solver of ``argmin_z loss(z)`` (a small frozen dataclass)."""

    max_steps: int
    tol: float | None
    needs_residuals: ClassVar[bool] = False
    supports_constraints: ClassVar[bool] = False

    @abstractmethod
    def minimize(self, objective: Objective, z0: State) -> tuple[State, SolverStats]:
        """Minimise from ``z0`` (only the minimum: how it is differentiated is the backward
        mode's business; see ``ReplaysSteps``)."""

    @property
    def name(self) -> str:
        """The registry name of this minimizer."""
        return MINIMIZERS.name_of(self) or type(self).__name__


class ReplaysSteps(ABC):
    """The capability of a minimizer whose steps are differentiable maps (gradient descent,
    Gauss-Newton, Levenberg-Marquardt): it can run its own last ``grad_steps`` steps with
    gradient, which the through-iteration modes (``Unroll``, ``Truncated``, ``OneStep``)
    differentiate. A minimizer without it is refused under those modes."""

    @abstractmethod
    def minimize_replaying(
        self, objective: Objective, z0: State, grad_steps: int
    ) -> tuple[State, SolverStats]:
        """``minimize(objective, z0)`` with the last ``grad_steps`` steps carrying gradient
        (all of them when ``grad_steps >= max_steps``); the value must not depend on it."""


# (x, the residual vector whose norm is recorded): at the start, then after each step
Iterates = Iterator[tuple[Tensor, Tensor]]


class FlatMinimizer(Minimizer):
    """A minimizer that iterates on the flat state (M,) with steps that are not differentiable
    maps (line searches, inner solves): the through-iteration modes are refused.

    A subclass gives ``_iterates(objective, x0)``, yielding ``(x, residual)`` at x0 and after
    each step (the residual: the gradient, ``J^T r`` for a sum of squares); ``minimize`` stops
    after ``max_steps`` steps or once every sample's residual norm is ``<= tol``.
    """

    @abstractmethod
    def _iterates(self, objective: Objective, x: Tensor) -> Iterates:
        """The iterates from the flat start x (M,), each with its residual vector (M,)."""

    def minimize(self, objective: Objective, z0: State) -> tuple[State, SolverStats]:
        spec, trace = objective.spec, ResidualTrace(self.name)
        steps = self._iterates(objective, objective.flat(z0).detach())
        x, residual = next(steps)
        trace.start(spec, residual)
        for _ in range(self.max_steps):
            if trace.done(self.tol):
                break
            x, residual = next(steps)
            trace.record(spec, residual)
        return objective.state(x), trace.build(self.tol)


@MINIMIZERS.register("gradient_descent")
@dataclass(frozen=True)
class GradientDescent(Minimizer, ReplaysSteps):
    """(Projected) gradient descent ``z <- P(z - lr grad_z loss(z))`` with a fixed step.

    Args:
        lr: the step; converges for ``lr < 2 / L`` (L the gradient's Lipschitz constant).
        max_steps: iterations. tol: stop when every sample's (projected) gradient norm is
            ``<= tol``; None runs exactly ``max_steps`` steps.
    """

    lr: float = 0.1
    max_steps: int = 500
    tol: float | None = 1e-8
    supports_constraints: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_tolerance("GradientDescent", "lr", self.lr)
        check_budget("GradientDescent", self.max_steps, self.tol)

    def step_map(self, objective: Objective) -> Callable[[State], State]:
        """``z -> P(z - lr grad(z))``: the map whose fixed point is the (constrained) minimum."""
        project = objective.constraint.project if objective.constraint else (lambda z: z)

        def step(z: State) -> State:
            grad = objective.gradient(z)
            return project(tuple(t - self.lr * d for t, d in zip(z, grad, strict=True)))

        return step

    def minimize(self, objective: Objective, z0: State) -> tuple[State, SolverStats]:
        return self.minimize_replaying(objective, z0, 0)

    def minimize_replaying(
        self, objective: Objective, z0: State, grad_steps: int
    ) -> tuple[State, SolverStats]:
        tol = None if self.tol is None else self.lr * self.tol
        loop = FixedPointIteration(max_steps=self.max_steps, tol=tol, stop_mode="abs")
        z, stats = loop.solve_replaying(self.step_map(objective), z0, objective.spec, grad_steps)
        return z, dataclasses.replace(
            stats,
            solver=self.name,
            residuals=stats.residuals / self.lr,
            abs_residual=stats.abs_residual / self.lr,
        )


