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

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch
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
        batch: B, the samples the M entries belong to (M = B * N, sample-major); solvers that
            work per sample (``Auto``'s dense blocks) read it. 1: one system.
    """

    vjp: Callable[[Tensor], Tensor]
    vjp_batched: Callable[[Tensor], Tensor]
    size: int
    system: Callable[[Tensor], Tensor] | None = None
    system_batched: Callable[[Tensor], Tensor] | None = None
    label: str = "I - J"
    batch: int = 1

    def apply(self, x: Tensor) -> Tensor:
        """(M,) -> (M,): the system matrix ``A^T x`` (``x - J^T x`` unless ``system`` is given)."""
        return x - self.vjp(x) if self.system is None else self.system(x)

    def system_matrix(self, eye: Tensor) -> Tensor:
        """(M, M): ``A^T`` materialised from the batched products of the rows of ``eye``."""
        if self.system_batched is None:
            return eye - self.vjp_batched(eye).T
        return self.system_batched(eye).T

    def system_matrix_rows(self, rows: Tensor) -> Tensor:
        """(P, M) -> (P, M): ``A^T`` applied to each row (batched)."""
        if self.system_batched is None:
            return rows - self.vjp_batched(rows)
        return self.system_batched(rows)


def discounted(op: AdjointOperator, factor: float) -> AdjointOperator:
    """The operator ``factor * J^T`` (same size): ``Implicit(ridge=λ)`` solves with
    ``factor = 1 / (1 + λ)``."""
    return AdjointOperator(
        vjp=lambda g: factor * op.vjp(g),
        vjp_batched=lambda g: factor * op.vjp_batched(g),
        size=op.size,
        batch=op.batch,
    )


# Rademacher probes that estimate the row norms of a system (``row_scales``), with a fixed seed
# so that a backward pass is reproducible; the equilibration sweeps (each SCALE_PROBES products,
# one at a time: a batched VJP costs more than 4 single ones; at most SCALE_PRODUCTS in all);
# the band around the median row norm within which rows count as equally scaled (above the
# estimates' noise for a row of many comparable entries: the mean of 4 squared Rademacher
# products falls below 1e-4 of its mean with probability ~2e-8).
SCALE_PROBES = 4
SCALE_SWEEPS = 3
SCALE_PRODUCTS = SCALE_PROBES * SCALE_SWEEPS
SCALE_BAND = 100.0
SCALE_SETTLED = 4.0
_SCALE_SEED = 0


def row_scales(
    op: AdjointOperator, dtype: torch.dtype, device: torch.device
) -> tuple[Tensor | None, int]:
    """(M,) positive scales D that equilibrate the system ``A^T`` (``op.apply``) symmetrically
    (``D^-1/2 A^T D^-1/2`` has rows of comparable norm), or None for a system whose rows are
    already within ``SCALE_BAND`` of each other; and the products spent.

    Ruiz's equilibration with estimated 2-norms: a sweep estimates the row norms of the
    current scaled system from ``E[(A^T z)_i^2] = ||row i||^2`` over ``SCALE_PROBES`` fixed
    Rademacher vectors z and divides row and column i of every usable row by the square root
    of its norm relative to the median. ``SCALE_BAND`` decides whether to scale at all: a
    system whose rows are all within it of the median norm is solved unscaled (the estimate's
    noise is a few tens of percent), at the cost of one sweep. Once scaling, the sweeps go on
    until every row is within ``SCALE_SETTLED`` of the median, ``SCALE_SWEEPS`` at most
    (rescaling only the rows outside the band left a system with row scales spread over
    1e+-1.5 at κ = 1.5e5 instead of 2e2). One sweep is not enough for a row dominated by its
    off-diagonal entry: on the Hessian of an
    exponential curve fit (b1 ~ 240, b2 ~ 5e-4; κ = 1.1e13) three sweeps give κ = 4.8e4
    (Jacobi scaling: 3.2e2, but a diagonal needs one product per unknown). A row whose
    estimate is zero or not finite keeps its scale, so the scaling never divides by zero.
    """
    generator = torch.Generator().manual_seed(_SCALE_SEED)
    signs = torch.randint(0, 2, (SCALE_PROBES, op.size), generator=generator)
    probes = (2 * signs - 1).to(device=device, dtype=dtype)
    scale: Tensor | None = None
    for sweep in range(1, SCALE_SWEEPS + 1):
        root = torch.ones_like(probes[0]) if scale is None else scale.rsqrt()
        products = torch.stack([root * op.apply(root * z) for z in probes])
        norms = products.square().mean(dim=0).sqrt()
        good = torch.isfinite(norms) & (norms > 0)
        if not bool(good.any()):
            return scale, sweep * SCALE_PROBES
        median = norms[good].median()
        band = SCALE_BAND if scale is None else SCALE_SETTLED
        outside = good & ((norms > band * median) | (norms * band < median))
        if not bool(outside.any()):
            return scale, sweep * SCALE_PROBES
        # every usable row, not only those outside the band: a row inside it is still off by
        # up to the band's factor, and κ grows with the product of such factors
        scale = torch.where(good, norms / median, 1.0) * (1.0 if scale is None else scale)
    return scale, SCALE_PRODUCTS


def scaled(op: AdjointOperator, scale: Tensor) -> AdjointOperator:
    """The symmetrically scaled system ``D^-1/2 A^T D^-1/2`` with ``D = diag(scale)`` (M,).

    Solving it for ``y = D^1/2 g`` with right-hand side ``D^-1/2 v`` gives ``g``; a symmetric
    (positive-definite) system stays so, so CG still applies. Its residual
    ``D^-1/2 (A^T g - v)`` weighs each equation by its own size, as MINPACK's column scaling
    weighs each variable.
    """
    root = scale.rsqrt()

    def system(x: Tensor) -> Tensor:
        return root * op.apply(root * x)

    def system_batched(rows: Tensor) -> Tensor:
        return root * op.system_matrix_rows(root * rows)

    return AdjointOperator(
        vjp=lambda x: x - system(x),
        vjp_batched=lambda rows: rows - system_batched(rows),
        size=op.size,
        system=system,
        system_batched=system_batched,
        label=f"D^-1/2 ({op.label}) D^-1/2",
        batch=op.batch,
    )


def relative_residual(op: AdjointOperator, v: Tensor, g: Tensor) -> float:
    """``||A^T g - v|| / ||v||`` (one product, one host read); inf where it is not finite."""
    residual = torch.linalg.vector_norm(op.apply(g) - v) / torch.linalg.vector_norm(v)
    value = float(residual)
    return value if math.isfinite(value) else math.inf


class LinearSolve(NamedTuple):
    """What a linear solve returns (a named tuple: ``g, steps, cond = solver.solve(...)`` works).

    Attributes:
        g: (M,) the solution of ``g = J^T g + v`` (NaN where a non-finite product was met).
        steps: matrix-vector products (VJPs) spent.
        cond: κ(I - J) when the solver obtains it (exact for a dense solver; a lower bound
            for GMRES, see ``LinearSolver.cond_is_bound``), else None.
    """

    g: Tensor
    steps: int
    cond: float | None


class LinearSolver(ABC):
    """Solves ``(I - J^T) g = v`` given ``J^T`` as an operator (``A^T g = v`` in general, see
    ``AdjointOperator``). ``requires_spd``: the solver is only correct for a symmetric
    positive-definite system (the conformance kit then checks it on such systems).
    ``iterative``: it stops on a tolerance (value-dependent control flow), so it cannot run
    under ``torch.func.vmap``. ``scalable``: a Krylov solver whose answer does not depend on
    the system's scaling in exact arithmetic, so ``Implicit(scaling=True)`` hands it the
    symmetrically scaled system (``scaled``). ``cond_is_bound``: its ``cond`` is only a lower
    bound of κ (from a Krylov space that may be too small to bound anything), reported as
    ``BackwardStats.cond_lower_bound`` with ``cond=None`` (κ unknown)."""

    requires_spd: ClassVar[bool] = False
    iterative: ClassVar[bool] = True
    scalable: ClassVar[bool] = False
    cond_is_bound: ClassVar[bool] = False

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

    def choices(self, op: AdjointOperator) -> tuple[LinearSolver, ...]:
        """The solvers to try on ``op``, in order (``Implicit`` takes the first whose answer
        passes its residual check, the last one in any case): this solver itself, except for
        a solver that picks by size (``Auto``)."""
        return (self,)

    def traced_choice(self, op: AdjointOperator) -> LinearSolver:
        """The one solver to use where no host check can run (``torch.compile``): it must be
        right without a residual check (``Auto``: never the per-sample blocks, which assume
        independent samples)."""
        return self

    @property
    def name(self) -> str:
        """The registry name of this linear solver."""
        return LINEAR_SOLVERS.name_of(self) or type(self).__name__


def to_host(values: Tensor) -> list[float]:
    """The entries of a small 1-D tensor as Python floats: one device-to-host transfer (a
    synchronisation on an accelerator). Every convergence decision of ``GMRES`` reads its
    numbers through here, once per decision."""
    return values.tolist()

