"""Linear solvers for the implicit backward pass: find g with ``g = J^T g + v``.

The same solvers serve the root-finding and argmin layers (``ih.root``, ``ih.minimize``), whose
systems are posed directly as ``A^T g = v`` (``A = dg/dz``, the Hessian for a minimum):
``AdjointOperator.system`` then gives ``A^T x`` without forming ``I - (I - A^T)`` (no cancellation),
and ``vjp`` is its Richardson form ``x - A^T x`` for the solvers that iterate on ``J^T``. ``CG``
needs a symmetric positive-definite system and stops with an error on negative curvature.

``J = df/dz`` at the fixed point is never formed (except by ``Dense``); a solver sees it only as
``AdjointOperator.vjp``, one vector-Jacobian product per call, on the whole batch flattened to one
vector of length M = B * N (so samples coupled inside ``f``, e.g. by batch statistics, are handled
correctly). Every solver has the signature
``solve(op, v, max_steps, tol) -> LinearSolve(g, steps, cond)`` (a named tuple); the caller
checks the residual at the returned g itself, so no solver can report a false success.
A solver that meets a non-finite product returns a NaN vector; the caller applies the policy.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from torch import Tensor

from implicit_ham._core.registry import Registry

LINEAR_SOLVERS: Registry[LinearSolver] = Registry("linear solver")
make_linear_solver = LINEAR_SOLVERS.make_function("make_linear_solver", __name__)
register_linear_solver = LINEAR_SOLVERS.register_function("register_linear_solver", __name__)


@dataclass(frozen=True)
class AdjointOperator:
    """``J^T`` as vector-Jacobian products on flat vectors.

    Attributes:
        vjp: (M,) -> (M,), ``g -> J^T g``.
        vjp_batched: (P, M) -> (P, M), row-wise ``J^T``; used by the dense solver.
        size: M.
        system, system_batched: ``A^T`` directly, for a system not posed as ``I - J^T`` (the
            root / argmin layers: ``A = dg/dz``); None: ``A^T = I - J^T``.
        label: the system's name in messages ("I - J", "dg/dz", "Hessian").
    """

    vjp: Callable[[Tensor], Tensor]
    vjp_batched: Callable[[Tensor], Tensor]
    size: int
    system: Callable[[Tensor], Tensor] | None = None
    system_batched: Callable[[Tensor], Tensor] | None = None
    label: str = "I - J"

    def apply(self, x: Tensor) -> Tensor:
        """(M,) -> (M,): the system matrix ``A^T x`` (``x - J^T x`` unless ``system`` is given)."""
        return x - self.vjp(x) if self.system is None else self.system(x)

    def system_matrix(self, eye: Tensor) -> Tensor:
        """(M, M): ``A^T`` materialised from the batched products of the rows of ``eye``."""
        if self.system_batched is None:
            return eye - self.vjp_batched(eye).T
        return self.system_batched(eye).T


def discounted(op: AdjointOperator, factor: float) -> AdjointOperator:
    """The operator ``factor * J^T`` (same size): ``Implicit(ridge=λ)`` solves with
    ``factor = 1 / (1 + λ)``."""
    return AdjointOperator(
        vjp=lambda g: factor * op.vjp(g),
        vjp_batched=lambda g: factor * op.vjp_batched(g),
        size=op.size,
    )


class LinearSolve(NamedTuple):
    """What a linear solve returns (a named tuple: ``g, steps, cond = solver.solve(...)`` works).

    Attributes:
        g: (M,) the solution of ``g = J^T g + v`` (NaN where a non-finite product was met).
        steps: matrix-vector products (VJPs) spent.
        cond: κ(I - J) when the solver obtains it (exact, or a lower bound for GMRES), else None.
    """

    g: Tensor
    steps: int
    cond: float | None


class LinearSolver(ABC):
    """Solves ``(I - J^T) g = v`` given ``J^T`` as an operator (``A^T g = v`` in general, see
    ``AdjointOperator``). ``requires_spd``: the solver is only correct for a symmetric
    positive-definite system (the conformance kit then checks it on such systems).
    ``iterative``: it stops on a tolerance (value-dependent control flow), so it cannot run
    under ``torch.func.vmap``."""

    requires_spd: ClassVar[bool] = False
    iterative: ClassVar[bool] = True

    @abstractmethod
    def solve(
        self, op: AdjointOperator, v: Tensor, max_steps: int, tol: float
    ) -> LinearSolve:
        """Return a ``LinearSolve(g, steps, cond)``; ``cond`` is κ(I - J) (exact, or a lower
        bound for GMRES) when the solver obtains it, else None.

        Args:
            op: the operator. v: (M,) right-hand side (the incoming gradient).
            max_steps: budget of VJPs. tol: target ``||g - J^T g - v|| / ||v||``.
        """

    @property
    def name(self) -> str:
        """The registry name of this linear solver."""
        return LINEAR_SOLVERS.name_of(self) or type(self).__name__


def to_host(values: Tensor) -> list[float]:
    """The entries of a small 1-D tensor as Python floats: one device-to-host transfer (a
    synchronisation on an accelerator). Every convergence decision of ``GMRES`` reads its
    numbers through here, once per decision."""
    return values.tolist()

