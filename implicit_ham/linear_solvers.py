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

import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import numpy as np
import torch
from torch import Tensor
from torchdeq.solver import broyden_solver

from implicit_ham.errors import NonFiniteError, NotPositiveDefiniteError
from implicit_ham.registry import Registry
from implicit_ham.torchdeq_solvers import guarded_anderson
from implicit_ham.transforms import host_checks
from implicit_ham.validation import check_positive_int

logger = logging.getLogger(__name__)

LINEAR_SOLVERS: Registry[LinearSolver] = Registry("linear solver")


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


@LINEAR_SOLVERS.register("fixed_point")
@dataclass(frozen=True)
class FixedPointLinear(LinearSolver):
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


@LINEAR_SOLVERS.register("gmres")
@dataclass(frozen=True)
class GMRES(LinearSolver):
    """Restarted GMRES on ``A = I - J^T`` (Gram-Schmidt applied twice per Arnoldi step).

    The Krylov basis lives in one preallocated (restart + 1, M) buffer; the least-squares
    problem of each step is kept in upper-triangular form by Givens rotations, applied on the
    host in float64 to the (at most restart + 1) Hessenberg entries of the new column, so its
    residual is known without a solve. Host synchronisations happen only where a decision is
    taken: one per Arnoldi step (the new Hessenberg column, whose last entries give the
    residual, the breakdown test and the finiteness test) and one per cycle start (the norm of
    the right-hand side or of the restart residual); none for the solution update. The
    Gram-Schmidt arithmetic is the same as with a growing list of basis vectors, so the result
    equals a float64 least-squares solve of the same Hessenberg system.

    Reports κ of its Arnoldi Hessenberg matrices (largest over cycles) as ``cond``: a free lower
    bound of κ(I - J), so a large value is conclusive evidence of an ill-conditioned system.

    Args:
        restart: Krylov dimension before a restart.
    """

    restart: int = 30

    def __post_init__(self) -> None:
        check_positive_int("GMRES", "restart", self.restart)

    def solve(
        self, op: AdjointOperator, v: Tensor, max_steps: int, tol: float
    ) -> LinearSolve:
        matvec = op.apply

        dim = min(self.restart, max(max_steps, 1))
        basis = v.new_empty(dim + 1, v.numel())
        x = torch.zeros_like(v)
        (v_norm,) = to_host(torch.linalg.vector_norm(v)[None])
        target = tol * v_norm
        r, beta, steps, cond = v, v_norm, 0, None
        while steps < max_steps:
            if beta <= target or beta == 0.0 or not math.isfinite(beta):
                break
            cycle = _ArnoldiCycle(basis, r, beta, target)
            if not cycle.run(matvec, min(dim, max_steps - steps)):
                return LinearSolve(torch.full_like(v, float("nan")), steps + cycle.size, cond)
            steps += cycle.size
            cond = max(cond or 0.0, cycle.cond())
            x = x + basis[: cycle.size].T @ cycle.coefficients(v.dtype, v.device)
            if cycle.converged or steps >= max_steps:
                break
            r = v - matvec(x)
            steps += 1
            (beta,) = to_host(torch.linalg.vector_norm(r)[None])
        return LinearSolve(x, steps, cond)


class _ArnoldiCycle:
    """One GMRES cycle on a preallocated basis (rows of ``basis``), the Hessenberg matrix and
    its Givens-rotated triangular factor kept on the host in float64.

    Attributes:
        size: Arnoldi steps (matrix-vector products) taken.
        converged: whether the least-squares residual reached ``target``.
    """

    def __init__(self, basis: Tensor, r: Tensor, beta: float, target: float) -> None:
        self.basis, self.beta, self.target = basis, beta, target
        torch.div(r, beta, out=basis[0])
        self.hess: list[list[float]] = []  # columns of the (size + 1, size) Hessenberg matrix
        self.tri: list[list[float]] = []  # the same columns after the Givens rotations
        self.rotations: list[tuple[float, float]] = []
        self.rhs = [beta]
        self.size, self.converged = 0, False

    def run(self, matvec: Callable[[Tensor], Tensor], dim: int) -> bool:
        """Take up to ``dim`` Arnoldi steps; False if a product came back non-finite."""
        for j in range(dim):
            active = self.basis[: j + 1]
            w = matvec(self.basis[j])
            coeffs = active @ w
            w = w - active.T @ coeffs
            again = active @ w
            w = w - active.T @ again
            norm = torch.linalg.vector_norm(w)
            column = to_host(torch.cat([coeffs + again, norm[None]]))  # the step's one sync
            self.size = j + 1
            if not all(map(math.isfinite, column)):
                return False
            residual = self._rotate(column)
            breakdown = column[-1] <= 1e-14 * self.beta
            if residual <= self.target or breakdown:
                self.converged = residual <= self.target
                return True
            if j + 1 < len(self.basis):
                torch.div(w, norm, out=self.basis[j + 1])
        return True

    def _rotate(self, column: list[float]) -> float:
        """Append a Hessenberg column, rotate it into triangular form; return the least-squares
        residual ``|rhs[j + 1]|``."""
        self.hess.append(list(column))
        col = list(column)
        for i, (c, s) in enumerate(self.rotations):
            col[i], col[i + 1] = c * col[i] + s * col[i + 1], -s * col[i] + c * col[i + 1]
        j = len(self.rotations)
        radius = math.hypot(col[j], col[j + 1])
        c, s = (1.0, 0.0) if radius == 0.0 else (col[j] / radius, col[j + 1] / radius)
        col[j], col[j + 1] = radius, 0.0
        self.rotations.append((c, s))
        self.tri.append(col[: j + 1])
        self.rhs.append(-s * self.rhs[j])
        self.rhs[j] = c * self.rhs[j]
        return abs(self.rhs[j + 1])

    def coefficients(self, dtype: torch.dtype, device: torch.device) -> Tensor:
        """y minimising ``||beta e1 - H y||``: back substitution in the rotated system."""
        k = self.size
        y = [0.0] * k
        for i in reversed(range(k)):
            acc = self.rhs[i] - sum(self.tri[j][i] * y[j] for j in range(i + 1, k))
            diag = self.tri[i][i]
            y[i] = acc / diag if diag != 0.0 else 0.0
        return torch.tensor(y, dtype=dtype, device=device)

    def cond(self) -> float:
        """κ of this cycle's Hessenberg matrix (see ``_hessenberg_cond``)."""
        hess = np.zeros((self.size + 1, self.size))
        for j, column in enumerate(self.hess):
            hess[: j + 2, j] = column
        return _hessenberg_cond(hess)


@LINEAR_SOLVERS.register("cg")
@dataclass(frozen=True)
class CG(LinearSolver):
    """Conjugate gradients on ``A^T g = v`` for a symmetric positive-definite system (a Hessian
    at a strict minimum; ``I - J`` of a gradient-descent map). One product per step.

    A direction p with curvature ``p^T A p <= curvature_tol * ||p||^2`` (an indefinite or
    singular system, e.g. a saddle point) stops the solve with ``NotPositiveDefiniteError``
    naming the curvature: CG's answer there would be silently wrong. Use GMRES or Dense
    for a system that is not positive definite.
    """

    curvature_tol: float = 0.0
    requires_spd: ClassVar[bool] = True

    def solve(
        self, op: AdjointOperator, v: Tensor, max_steps: int, tol: float
    ) -> LinearSolve:
        x, r = torch.zeros_like(v), v
        p, rr = r, torch.dot(r, r)
        target = (tol * torch.linalg.vector_norm(v)) ** 2
        for step in range(1, max_steps + 1):
            ap = op.apply(p)
            curvature, length = float(torch.dot(p, ap)), float(torch.dot(p, p))
            if not math.isfinite(curvature):
                return LinearSolve(torch.full_like(v, float("nan")), step, None)
            if curvature <= self.curvature_tol * length:
                raise NotPositiveDefiniteError(
                    f"CG: the system {op.label} is not positive definite: direction {step} has "
                    f"curvature p^T A p = {curvature:.3e} (||p||^2 = {length:.3e}). CG needs a "
                    "symmetric positive-definite system (a strict minimum); use "
                    "linear_solver='gmres' or 'dense', or check that the point is a minimum."
                )
            alpha = rr / curvature
            x, r = x + alpha * p, r - alpha * ap
            rr_next = torch.dot(r, r)
            if bool(rr_next <= target):
                return LinearSolve(x, step, None)
            p, rr = r + (rr_next / rr) * p, rr_next
        return LinearSolve(x, max_steps, None)


@LINEAR_SOLVERS.register("anderson")
@dataclass(frozen=True)
class AndersonLinear(LinearSolver):
    """Anderson acceleration (torchdeq, guarded) of ``g <- J^T g + v``."""

    m: int = 5
    lam: float = 1e-4
    retry_lam: float = 1e-2

    def solve(
        self, op: AdjointOperator, v: Tensor, max_steps: int, tol: float
    ) -> LinearSolve:
        target = tol * float(torch.linalg.vector_norm(v))
        counter = _CountingMap(op.vjp, v)
        try:
            g = guarded_anderson(
                counter,
                v[None],
                max_iter=max(max_steps, 3),
                tol=target,
                stop_mode="abs",
                m=self.m,
                lam=self.lam,
                damping=1.0,
                retry_lam=self.retry_lam,
            )
        except NonFiniteError:
            return LinearSolve(torch.full_like(v, float("nan")), counter.calls, None)
        return LinearSolve(g[0], counter.calls, None)


@LINEAR_SOLVERS.register("broyden")
@dataclass(frozen=True)
class BroydenLinear(LinearSolver):
    """Broyden's method (torchdeq) on ``g - J^T g - v = 0``."""

    def solve(
        self, op: AdjointOperator, v: Tensor, max_steps: int, tol: float
    ) -> LinearSolve:
        target = tol * float(torch.linalg.vector_norm(v))
        counter = _CountingMap(op.vjp, v)
        g, _, _ = broyden_solver(
            counter, v[None], max_iter=max_steps, tol=target, stop_mode="abs", ls=False
        )
        return LinearSolve(g.reshape(-1), counter.calls, None)


@LINEAR_SOLVERS.register("dense")
@dataclass(frozen=True)
class Dense(LinearSolver):
    """Materialise ``I - J^T`` (M VJPs) and solve it exactly; reports κ(I - J).

    For small problems and as a reference. ``max_size`` bounds M (the matrix is M x M).
    """

    max_size: int = 4096
    iterative: ClassVar[bool] = False

    def solve(
        self, op: AdjointOperator, v: Tensor, max_steps: int, tol: float
    ) -> LinearSolve:
        if op.size > self.max_size:
            raise ValueError(
                f"Dense: the state has M={op.size} entries (batch included), above "
                f"max_size={self.max_size}; use linear_solver='gmres' or raise max_size"
            )
        eye = torch.eye(op.size, dtype=v.dtype, device=v.device)
        system = op.system_matrix(eye)
        if not host_checks():  # under vmap / while compiling: no value-dependent branches
            return LinearSolve(torch.linalg.solve(system, v), op.size, None)
        if not bool(torch.isfinite(system).all()):
            return LinearSolve(torch.full_like(v, float("nan")), op.size, None)
        cond = float(torch.linalg.cond(system.detach()))
        try:
            g = torch.linalg.solve(system, v)
        except torch.linalg.LinAlgError as err:
            raise NonFiniteError(
                f"Dense: the system {op.label} is singular (condition number {cond:.3e}); the "
                "solution is not isolated (e.g. NMF's scaling symmetry). Use a damped / "
                "regularised map or problem."
            ) from err
        return LinearSolve(g, op.size, cond)


def _hessenberg_cond(hess: np.ndarray) -> float:
    """κ of an Arnoldi Hessenberg matrix H (m+1, m) of A: a lower bound of κ(A), since
    ``A V_m = V_{m+1} H`` with orthonormal V gives σ_max(H) <= σ_max(A), σ_min(H) >= σ_min(A)."""
    values = np.linalg.svd(hess, compute_uv=False)
    return float(values[0] / values[-1]) if values[-1] > 0 else float("inf")


def to_host(values: Tensor) -> list[float]:
    """The entries of a small 1-D tensor as Python floats: one device-to-host transfer (a
    synchronisation on an accelerator). Every convergence decision of ``GMRES`` reads its
    numbers through here, once per decision."""
    return values.tolist()


class _CountingMap:
    """``x -> J^T x + v`` on (1, M) inputs, counting the VJPs it spends."""

    def __init__(self, vjp: Callable[[Tensor], Tensor], v: Tensor) -> None:
        self.vjp, self.v, self.calls = vjp, v, 0

    def __call__(self, x: Tensor) -> Tensor:
        self.calls += 1
        return (self.vjp(x.reshape(-1)) + self.v).reshape_as(x)
