"""Krylov methods, on one Arnoldi process: ``GMRES`` and ``CG`` for the backward linear solve,
``arnoldi_dominant`` (the dominant eigenvalue of a non-symmetric operator, e.g. ``J`` at a fixed
point) and ``lanczos_extremes`` (the extreme eigenvalues of a symmetric one) for the
diagnostics.

``arnoldi_step`` is the one Arnoldi step all of them share: ``w = A q_j`` orthogonalised against
the basis rows by classical Gram-Schmidt applied twice (for stability), returning w, the
coefficients removed and ``||w||`` on the device (the caller decides when to read them on the
host).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from implicit_ham._core.errors import NotPositiveDefiniteError
from implicit_ham._core.validation import check_positive_int
from implicit_ham.linalg.operator import (
    LINEAR_SOLVERS,
    AdjointOperator,
    LinearSolve,
    LinearSolver,
    to_host,
)

MatVec = Callable[[Tensor], Tensor]


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
    bound of κ(I - J), so a large value is conclusive evidence of an ill-conditioned system,
    and a small one no evidence at all (a one-step Krylov space bounds κ by 1 whatever the
    system): ``Implicit`` reports it as ``BackwardStats.cond_lower_bound`` with ``cond=None``
    (κ unknown). A small residual of an ill-scaled system can hide a large error (the residual
    is dominated by the large rows); ``Implicit`` hands GMRES the scaled system
    (``scalable``).

    Args:
        restart: Krylov dimension before a restart.
    """

    restart: int = 30
    scalable: ClassVar[bool] = True
    cond_is_bound: ClassVar[bool] = True

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
            w, coeffs, norm = arnoldi_step(matvec, self.basis[: j + 1])
            column = to_host(torch.cat([coeffs, norm[None]]))  # the step's one sync
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
    scalable: ClassVar[bool] = True

    def solve(
        self, op: AdjointOperator, v: Tensor, max_steps: int, tol: float
    ) -> LinearSolve:
        x, r = torch.zeros_like(v), v
        p, rr = r, float(torch.dot(r, r))  # the scalars of the recursion live on the host
        target = tol * tol * rr
        if rr == 0.0:  # v = 0: g = 0 solves the system exactly
            return LinearSolve(x, 0, None)
        for step in range(1, max_steps + 1):
            ap = op.apply(p)
            curvature = float(torch.dot(p, ap))  # the step's one synchronisation
            if not math.isfinite(curvature):
                return LinearSolve(torch.full_like(v, float("nan")), step, None)
            if curvature <= 0.0 or self.curvature_tol:
                length = float(torch.dot(p, p))
                if curvature <= self.curvature_tol * length:
                    raise NotPositiveDefiniteError(
                        f"CG: the system {op.label} is not positive definite: direction {step} "
                        f"has curvature p^T A p = {curvature:.3e} (||p||^2 = {length:.3e}). CG "
                        "needs a symmetric positive-definite system (a strict minimum); use "
                        "linear_solver='gmres' or 'dense', or check that the point is a minimum."
                    )
            alpha = rr / curvature
            x, r = torch.add(x, p, alpha=alpha), torch.add(r, ap, alpha=-alpha)
            rr_next = float(torch.dot(r, r))
            if rr_next <= target:
                return LinearSolve(x, step, None)
            p, rr = torch.add(r, p, alpha=rr_next / rr), rr_next
        return LinearSolve(x, max_steps, None)


def _hessenberg_cond(hess: np.ndarray) -> float:
    """κ of an Arnoldi Hessenberg matrix H (m+1, m) of A: a lower bound of κ(A), since
    ``A V_m = V_{m+1} H`` with orthonormal V gives σ_max(H) <= σ_max(A), σ_min(H) >= σ_min(A)."""
    values = np.linalg.svd(hess, compute_uv=False)
    return float(values[0] / values[-1]) if values[-1] > 0 else float("inf")



# A new Krylov direction shorter than this fraction of ||A q_j|| means the space is invariant.
_BREAKDOWN = 1e-13


@dataclass(frozen=True)
class RitzEstimate:
    """The dominant eigenvalue estimate of an Arnoldi run.

    Attributes:
        value: the Ritz value of largest modulus (complex).
        residual: ``||A x - value x||`` for its unit Ritz vector x (0 after a breakdown, when
            the Krylov space is invariant and the value is exact up to round-off).
        products: operator applications spent.
    """

    value: complex
    residual: float
    products: int


@dataclass(frozen=True)
class LanczosEstimate:
    """The extreme Ritz values of a symmetric operator and the Ritz vector of the smallest.

    Attributes:
        smallest: smallest Ritz value (>= the true smallest eigenvalue).
        largest: largest Ritz value (<= the true largest eigenvalue).
        smallest_vector: (M,) unit Ritz vector of ``smallest``.
        products: operator applications spent.
    """

    smallest: float
    largest: float
    smallest_vector: Tensor
    products: int


def arnoldi_step(matvec: MatVec, basis: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """One Arnoldi step from the orthonormal rows of ``basis`` (j + 1, M): ``w = A q_j`` with its
    components along the rows removed (classical Gram-Schmidt, twice).

    Returns:
        w (M,), the (j + 1,) coefficients removed (the new Hessenberg column above its
        subdiagonal entry) and ``||w||`` (0-d), all on the device of ``basis``.
    """
    w = matvec(basis[-1])
    coeffs = basis @ w
    w = w - basis.T @ coeffs
    again = basis @ w
    w = w - basis.T @ again
    return w, coeffs + again, torch.linalg.vector_norm(w)


def _arnoldi(matvec: MatVec, start: Tensor, dim: int) -> tuple[Tensor, Tensor, float, int]:
    """Arnoldi factorisation ``A Q_m = Q_m H_m + h e_m^T``.

    Returns (Q_m (m, M), H_m (m, m) float64 CPU, h = the trailing subdiagonal entry, m).
    m < dim after a breakdown (then h = 0).
    """
    basis = start.new_empty(dim, start.numel())
    torch.div(start, torch.linalg.vector_norm(start), out=basis[0])
    hess = torch.zeros(dim + 1, dim, dtype=torch.float64)
    for j in range(dim):
        w, coeffs, norm = arnoldi_step(matvec, basis[: j + 1])
        hess[: j + 1, j] = coeffs.detach().to("cpu", torch.float64)
        h = float(norm)
        hess[j + 1, j] = h
        scale = math.hypot(h, float(torch.linalg.vector_norm(hess[: j + 1, j])))  # ||A q_j||
        if h <= _BREAKDOWN * scale or h == 0.0:
            return basis[: j + 1], hess[: j + 1, : j + 1], 0.0, j + 1
        if j + 1 < dim:
            torch.div(w, h, out=basis[j + 1])
    return basis, hess[:dim, :dim], float(hess[dim, dim - 1]), dim


def arnoldi_dominant(
    matvec: MatVec, start: Tensor, dim: int = 30, restarts: int = 3, rtol: float = 1e-4
) -> RitzEstimate:
    """Eigenvalue of largest modulus of a (non-symmetric) operator, by restarted Arnoldi.

    Each cycle builds a ``dim``-dimensional Krylov space and takes the Ritz value of largest
    modulus; the next cycle restarts from the real plus imaginary part of its Ritz vector (for a
    complex-conjugate pair both lie in the pair's real invariant plane). Stops when the Ritz
    residual is ``<= rtol * |value|`` or after ``restarts`` restarts. For a non-normal operator
    the eigenvalue error may exceed the residual by the eigenvalue's condition number.

    Args:
        matvec: (M,) -> (M,), the operator. start: (M,) nonzero start vector.
        dim: Krylov dimension per cycle (clipped to M). restarts: extra cycles allowed.
        rtol: relative residual at which to stop.
    """
    dim = min(dim, start.numel())
    vector, products = start, 0
    estimate = RitzEstimate(0j, float("inf"), 0)
    for _ in range(restarts + 1):
        basis, hess, h_last, m = _arnoldi(matvec, vector, dim)
        products += m
        values, vectors = torch.linalg.eig(hess)
        top = int(values.abs().argmax())
        value = complex(values[top])
        residual = abs(h_last) * float(vectors[-1, top].abs())
        estimate = RitzEstimate(value, residual, products)
        if residual <= rtol * max(abs(value), torch.finfo(start.dtype).tiny):
            break
        ritz = vectors[:, top].to(start.device)
        vector = basis.T.to(ritz.dtype) @ ritz
        vector = (vector.real + vector.imag).to(start.dtype)
        if not bool(vector.any()):
            break
    return estimate


def lanczos_extremes(matvec: MatVec, start: Tensor, steps: int = 30) -> LanczosEstimate:
    """Extreme eigenvalues of a symmetric operator by Lanczos (full re-orthogonalisation).

    The Ritz values are interlaced within the spectrum: ``smallest`` is an upper bound of the
    smallest eigenvalue and ``largest`` a lower bound of the largest. Extreme eigenvalues
    converge first; the smallest converges slowly when it is tiny relative to the largest.

    Args:
        matvec: (M,) -> (M,), a symmetric operator. start: (M,) nonzero start vector.
        steps: Krylov dimension (clipped to M).
    """
    steps = min(steps, start.numel())
    basis = start.new_empty(steps, start.numel())
    torch.div(start, torch.linalg.vector_norm(start), out=basis[0])
    alphas: list[float] = []
    betas: list[float] = []
    for j in range(steps):
        w, coeffs, norm = arnoldi_step(matvec, basis[: j + 1])
        column = coeffs.detach().to("cpu", torch.float64)
        alphas.append(float(column[j]))
        beta = float(norm)
        scale = math.hypot(beta, float(torch.linalg.vector_norm(column)))  # ||A q_j||
        if beta <= _BREAKDOWN * scale or beta == 0.0 or j + 1 == steps:
            break
        betas.append(beta)
        torch.div(w, beta, out=basis[j + 1])
    m = len(alphas)
    tri = torch.diag(torch.tensor(alphas, dtype=torch.float64))
    off = torch.tensor(betas[: m - 1], dtype=torch.float64)
    tri += torch.diag(off, 1) + torch.diag(off, -1)
    values, vectors = torch.linalg.eigh(tri)
    q = basis[:m]
    smallest_vector = q.T @ vectors[:, 0].to(q.device, q.dtype)
    return LanczosEstimate(float(values[0]), float(values[-1]), smallest_vector, m)

