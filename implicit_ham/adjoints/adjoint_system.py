"""The two conditions the implicit backward pass differentiates, and what it is handed.

A fixed point ``z* = f(z*, θ)`` and a root ``g(z*, θ) = 0`` differ in three places only: the
forward residual the fixed-point check reads, the adjoint system the backward solve poses, and
the sign with which the adjoint vector is handed to the map's graph. ``FixedPointSystem`` and
``RootSystem`` each say these three things; ``implicit_backward`` and ``second_order`` ask them
instead of branching on the kind of condition.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import Tensor

from implicit_ham._core.state import State, StateSpec, per_sample_norm
from implicit_ham._core.stats import BackwardStats
from implicit_ham.adjoints.fixed_point_check import FixedPointCheck
from implicit_ham.linalg.operator import AdjointOperator

if TYPE_CHECKING:
    from implicit_ham.adjoints.second_order import BackwardSolve, SecondOrder

Product = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class FixedPointSystem:
    """``z* = f(z*, θ)``. Differentiating it, ``dz* = J dz* + ∂_θ f dθ`` with ``J = ∂f/∂z`` at
    z*, so ``dz*/dθ = (I - J)^{-1} ∂_θ f`` and a vector-Jacobian product with v needs the
    adjoint u of the transposed system ``(I - J)^T u = v``; u is then handed to f's graph as
    it is, which gives ``(∂_θ f)^T u``."""

    label: str = "I - J"
    root: ClassVar[bool] = False

    def residual(self, fz: State, z: State) -> Tensor:
        """``||f(z) - z|| / ||f(z)||`` per sample, shape ``(batch,)``."""
        change = per_sample_norm(tuple(a - b for a, b in zip(fz, z, strict=True)))
        return change / (per_sample_norm(fz) + torch.finfo(change.dtype).tiny)

    def operator(self, product: Product, rows: Product, size: int, batch: int) -> AdjointOperator:
        """The operator whose ``vjp`` is ``J^T`` (``product``: a VJP through f's graph); the
        backward solve poses ``I - J^T`` from it."""
        return AdjointOperator(product, rows, size, label=self.label, batch=batch)

    def fed(self, u: Tensor) -> Tensor:
        """The vector handed to f's graph: u itself."""
        return u


@dataclass(frozen=True)
class RootSystem:
    """``g(z*, θ) = 0``. Differentiating it, ``A dz* + ∂_θ g dθ = 0`` with ``A = ∂g/∂z`` at z*,
    so ``dz*/dθ = -A^{-1} ∂_θ g`` and a vector-Jacobian product with v solves the transposed
    system ``A^T w = v`` and hands ``-w`` to g's graph, which gives ``-(∂_θ g)^T w``."""

    label: str = "dg/dz"
    root: ClassVar[bool] = True

    def residual(self, gz: State, z: State) -> Tensor:
        """``||g(z)||`` per sample (absolute), shape ``(batch,)``."""
        return per_sample_norm(gz)

    def operator(self, product: Product, rows: Product, size: int, batch: int) -> AdjointOperator:
        """The operator whose ``system`` is ``A^T`` (``product``: a VJP through g's graph);
        its ``vjp`` is ``I - A^T``, the fixed-point form of ``z - g(z)``, for the solvers that
        only know that form (Neumann)."""
        return AdjointOperator(
            vjp=lambda x: x - product(x),
            vjp_batched=lambda b: b - rows(b),
            size=size,
            system=product,
            system_batched=rows,
            label=self.label,
            batch=batch,
        )

    def fed(self, w: Tensor) -> Tensor:
        """The vector handed to g's graph: ``-w`` (the solution moves against g)."""
        return -w


AdjointSystem = FixedPointSystem | RootSystem


@dataclass(frozen=True)
class Attachment:
    """What a backward pass is given besides the map and the point.

    Attributes:
        spec: the state's structure.
        backward_solve: maps (the adjoint operator, flat incoming gradient v of size M) to the
            adjoint vector (M,) and its statistics.
        log: each backward's ``BackwardStats`` is appended here.
        check: what to do in backward when z* does not satisfy the condition.
        rule: how ``create_graph=True`` differentiates the backward pass; None refuses it
            (``SecondOrderError``).
    """

    spec: StateSpec
    backward_solve: BackwardSolve
    log: list[BackwardStats]
    check: FixedPointCheck
    rule: SecondOrder | None = None
