"""The iterations of ``g <- J^T g + v`` for the backward linear solve: ``FixedPointSolve`` (the
Neumann series; converges iff the spectral radius of J is < 1), ``AndersonSolve`` and
``BroydenSolve`` (the native kernels of ``implicit_ham.linalg.acceleration`` on the whole batch
flattened to one (1, M) vector). Each counts the vector-Jacobian products it spends; the caller
checks the residual at the returned g itself."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from implicit_ham.linalg.acceleration import anderson, broyden
from implicit_ham.linalg.anderson_options import AndersonOptions
from implicit_ham.linalg.operator import LINEAR_SOLVERS, AdjointOperator, LinearSolve, LinearSolver

logger = logging.getLogger(__name__)


@LINEAR_SOLVERS.register("fixed_point")
@dataclass(frozen=True)
class FixedPointSolve(LinearSolver):
    """Neumann iteration ``g <- J^T g + v``; converges iff the spectral radius of J is < 1."""

    def solve(
        self, op: AdjointOperator, v: Tensor, max_steps: int, tol: float
    ) -> LinearSolve:
        g, target = v, tol * torch.linalg.vector_norm(v)
        for step in range(1, max_steps + 1):
            g_next = op.vjp(g) + v
            done = bool(torch.linalg.vector_norm(g_next - g) <= target)
            g = g_next
            if done:
                return LinearSolve(g, step, None)
        return LinearSolve(g, max_steps, None)


@LINEAR_SOLVERS.register("anderson")
@dataclass(frozen=True)
class AndersonSolve(AndersonOptions, LinearSolver):
    """Anderson acceleration of ``g <- J^T g + v`` (the native kernel of
    ``implicit_ham.linalg.acceleration``), with the mixing options of every Anderson solver
    (``AndersonOptions``: ``m``, ``lam``, ``retry_lam``). A singular mixing system or a
    non-finite iterate is retried once with ``lam`` raised to ``retry_lam``; a second failure
    returns NaN (the caller applies the policy)."""

    def solve(
        self, op: AdjointOperator, v: Tensor, max_steps: int, tol: float
    ) -> LinearSolve:
        target = tol * float(torch.linalg.vector_norm(v))
        counter = _CountingMap(op.vjp, v)
        for lam in self.attempts:
            result = anderson(
                counter, v[None], max_evals=max(max_steps, 3), tol=target, stop_mode="abs",
                m=self.m, lam=lam,
            )
            if result.failed_at is None and bool(torch.isfinite(result.x).all()):
                return LinearSolve(result.x[0], counter.calls, None)
            logger.warning("AndersonSolve: non-finite iterate with lam=%g", lam)
        return LinearSolve(torch.full_like(v, float("nan")), counter.calls, None)


@LINEAR_SOLVERS.register("broyden")
@dataclass(frozen=True)
class BroydenSolve(LinearSolver):
    """Broyden's method on ``g - J^T g - v = 0`` (the native kernel of
    ``implicit_ham.linalg.acceleration``, no line search); a non-finite iterate returns NaN."""

    def solve(
        self, op: AdjointOperator, v: Tensor, max_steps: int, tol: float
    ) -> LinearSolve:
        target = tol * float(torch.linalg.vector_norm(v))
        counter = _CountingMap(op.vjp, v)
        result = broyden(counter, v[None], max_evals=max_steps + 1, tol=target, stop_mode="abs")
        if result.failed_at is not None or not bool(torch.isfinite(result.x).all()):
            return LinearSolve(torch.full_like(v, float("nan")), counter.calls, None)
        return LinearSolve(result.x[0], counter.calls, None)


class _CountingMap:
    """``x -> J^T x + v`` on (1, M) inputs, counting the VJPs it spends."""

    def __init__(self, vjp: Callable[[Tensor], Tensor], v: Tensor) -> None:
        self.vjp, self.v, self.calls = vjp, v, 0

    def __call__(self, x: Tensor) -> Tensor:
        self.calls += 1
        return (self.vjp(x.reshape(-1)) + self.v).reshape_as(x)
