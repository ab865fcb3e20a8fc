"""Root solvers of ``g(z) = 0`` and their registry: ``Newton`` (the step ``(dg/dz) Δ = -g``
solved by any linear solver of ``implicit_ham.linalg`` on Jacobian-vector products, posed by
``jacobian_operator``) and the ``RootSolver`` base class.

``ih.root`` accepts these or any fixed-point solver applied to ``z <- z - g(z)``.

Through-iteration gradients (``Unroll``, ``Truncated(k)``, ``OneStep``): the steps that carry
gradient are replayed after the solve from their stored iterates, each as the exact Newton step
``-(dg/dz)⁻¹ g`` with the dense Jacobian (``torch.func.jacrev``) and ``torch.linalg.solve`` in
the graph, so the gradient is that of the unrolled Newton iteration; the values stay the
linear solver's (``with_gradient_of``), so they do not depend on the mode. The dense Jacobian
bounds the state to ``MAX_UNROLLED_SIZE`` entries (batch included).
"""


from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from implicit_ham._core.registry import Registry
from implicit_ham._core.state import State, StateSpec, StepFn, with_gradient_of
from implicit_ham._core.stats import SolverStats
from implicit_ham._core.validation import (
    check_budget,
    check_positive_int,
    check_tolerance,
    check_unit_interval,
)
from implicit_ham.linalg.operator import LINEAR_SOLVERS, AdjointOperator, LinearSolver
from implicit_ham.solvers.base import ReplaysIterates, ResidualTrace

ROOT_SOLVERS: Registry[RootSolver] = Registry("root solver")
MAX_UNROLLED_SIZE = 4096
make_root_solver = ROOT_SOLVERS.make_function("make_root_solver", __name__)
register_root_solver = ROOT_SOLVERS.register_function("register_root_solver", __name__)


class RootSolver(ABC):
    """A solver of ``g(z) = 0`` (a small frozen dataclass in every concrete case).

    ``solve`` returns the root and a ``SolverStats`` whose residuals are ``||g(z_k)||`` per
    sample after each step, ``rel_residual = ||g(z)|| / ||g(z0)||`` and ``converged`` the
    absolute residual ``<= tol``.
    """

    max_steps: int
    tol: float | None

    @abstractmethod
    def solve(self, g: StepFn, z0: State, spec: StateSpec) -> tuple[State, SolverStats]:
        """Solve ``g(z) = 0`` from ``z0`` (only the root: a solver that can run its own last
        steps with gradient for the through-iteration modes declares ``ReplaysIterates``;
        one without is refused under them)."""

    @property
    def name(self) -> str:
        """The registry name of this solver."""
        return ROOT_SOLVERS.name_of(self) or type(self).__name__


@ROOT_SOLVERS.register("newton")
@dataclass(frozen=True)
class Newton(RootSolver, ReplaysIterates):
    """Newton's method: ``z <- z + damping * Δ`` with ``(dg/dz) Δ = -g(z)`` solved by a linear
    solver of the library on Jacobian-vector products (``torch.func.jvp``).

    Args:
        linear_solver: "gmres" (default), "dense" (small problems), "cg" (symmetric
            positive-definite dg/dz only), ... or a ``LinearSolver``.
        max_steps: Newton iterations. tol: stop when every sample's ``||g(z)|| <= tol``.
        linear_max_steps, linear_tol: the inner solve's budget and relative tolerance.
        damping: step size in (0, 1].
    """

    linear_solver: LinearSolver | str = "gmres"
    max_steps: int = 20
    tol: float | None = 1e-8
    linear_max_steps: int = 200
    linear_tol: float = 1e-10
    damping: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "linear_solver", LINEAR_SOLVERS.resolve(self.linear_solver, LinearSolver)
        )
        check_budget("Newton", self.max_steps, self.tol)
        check_positive_int("Newton", "linear_max_steps", self.linear_max_steps)
        check_tolerance("Newton", "linear_tol", self.linear_tol)
        check_unit_interval("Newton", "damping", self.damping)

    def solve(self, g: StepFn, z0: State, spec: StateSpec) -> tuple[State, SolverStats]:
        return self.solve_replaying(g, z0, spec, 0)

    def solve_replaying(
        self, g: StepFn, z0: State, spec: StateSpec, grad_steps: int
    ) -> tuple[State, SolverStats]:
        """``solve`` with the last ``grad_steps`` Newton steps carrying gradient (replayed with
        the dense Jacobian; refused above ``MAX_UNROLLED_SIZE`` entries)."""
        solver: LinearSolver = self.linear_solver  # type: ignore[assignment]
        trace = ResidualTrace(self.name)
        start = spec.flatten(z0).reshape(-1)
        keep = min(grad_steps, self.max_steps) if torch.is_grad_enabled() else 0
        if keep and start.numel() > MAX_UNROLLED_SIZE:
            raise ValueError(
                f"Newton: a through-iteration gradient replays the steps with the dense "
                f"Jacobian, but the state has {start.numel()} entries (batch included), above "
                f"{MAX_UNROLLED_SIZE}; use adjoint=Implicit(...) for large states"
            )

        def flat_g(y: Tensor) -> Tensor:
            return spec.flatten(g(spec.unflatten(y.reshape(spec.batch, -1)))).reshape(-1)

        history: deque[tuple[Tensor, Tensor]] = deque(maxlen=max(keep, 1))
        with torch.no_grad():
            x = start.detach()
            gx = flat_g(x)
            trace.start(spec, gx)
            for _ in range(self.max_steps):
                if trace.done(self.tol):
                    break
                op = jacobian_operator(flat_g, x, "dg/dz")
                delta, _, _ = solver.solve(op, -gx, self.linear_max_steps, self.linear_tol)
                if keep:
                    history.append((x, delta))
                x = x + self.damping * delta
                gx = flat_g(x)
                trace.record(spec, gx)
        if keep and history:
            x = self._replay(flat_g, start, history, keep >= self.max_steps, x)
        return spec.unflatten(x.reshape(spec.batch, -1)), trace.build(self.tol)

    def _replay(
        self,
        flat_g: Callable[[Tensor], Tensor],
        start: Tensor,
        history: deque[tuple[Tensor, Tensor]],
        from_start: bool,
        value: Tensor,
    ) -> Tensor:
        """The stored steps again with gradient: ``y <- y + damping Δ`` with Δ the solver's
        values carrying the gradient of the exact step ``-(dg/dy)⁻¹ g(y)``; from z0 itself
        (``Unroll``: z0 gets its gradient) or from the first stored iterate."""
        with torch.enable_grad():
            y = start if from_start else history[0][0]
            for _, delta in history:
                exact = -torch.linalg.solve(torch.func.jacrev(flat_g)(y), flat_g(y))
                y = y + self.damping * (delta + (exact - exact.detach()))
        (out,) = with_gradient_of((value,), (y,))
        return out


def jacobian_operator(fn: Callable[[Tensor], Tensor], x: Tensor, label: str) -> AdjointOperator:
    """The linear operator ``A = d fn / dx`` at x (M,), posed for the linear solvers as the
    system ``A Δ = b`` (``system``; ``vjp = I - A`` its Richardson form).

    ``fn`` is evaluated once; each product ``A v`` is the derivative of the VJP
    ``u -> A^T u`` in the direction v (double backward on the retained graph), cheaper than
    re-tracing ``fn`` with ``torch.func.jvp`` per product.
    """
    with torch.enable_grad():
        x_req = x.detach().requires_grad_()
        out = fn(x_req)
        u = torch.zeros_like(out, requires_grad=True)
        (transposed,) = torch.autograd.grad(out, x_req, u, create_graph=True, allow_unused=True)
    if transposed is None or not transposed.requires_grad:  # fn is affine or constant in x
        dense = torch.func.jacrev(fn)(x.detach()) if transposed is not None else None

        def jvp(v: Tensor) -> Tensor:
            return torch.zeros_like(v) if dense is None else dense @ v.to(dense.dtype)

    else:

        def jvp(v: Tensor) -> Tensor:
            (product,) = torch.autograd.grad(
                transposed, u, v.to(x.dtype), retain_graph=True, allow_unused=True
            )
            return (torch.zeros_like(v) if product is None else product.detach()).to(v.dtype)

    def jvp_rows(rows: Tensor) -> Tensor:
        return torch.stack([jvp(r) for r in rows])

    return AdjointOperator(
        vjp=lambda v: v - jvp(v),
        vjp_batched=lambda rows: rows - jvp_rows(rows),
        size=x.numel(),
        system=jvp,
        system_batched=jvp_rows,
        label=label,
    )

