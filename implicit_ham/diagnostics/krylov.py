"""Matrix-free Krylov eigenvalue estimates: Arnoldi for a general operator, Lanczos for a
symmetric one. Both use full re-orthogonalisation (classical Gram-Schmidt applied twice), which
is affordable because diagnostics use a few dozen products at most.

Vectors live on the operator's device and dtype; the small projected matrices (Hessenberg,
tridiagonal) are moved to the CPU in float64 for their eigen-decomposition.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

MatVec = Callable[[Tensor], Tensor]

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


def _orthogonalise(basis: list[Tensor], w: Tensor) -> tuple[Tensor, Tensor]:
    """Remove from w its components along the orthonormal ``basis`` (twice, for stability).

    Returns the orthogonalised w and the (len(basis),) float64 CPU coefficients removed.
    """
    q = torch.stack(basis)
    total = torch.zeros(len(basis), dtype=torch.float64)
    for _ in range(2):
        coeffs = q @ w
        w = w - q.T @ coeffs
        total += coeffs.detach().to("cpu", torch.float64)
    return w, total


def _arnoldi(matvec: MatVec, start: Tensor, dim: int) -> tuple[Tensor, Tensor, float, int]:
    """Arnoldi factorisation ``A Q_m = Q_m H_m + h e_m^T``.

    Returns (Q_m (m, M), H_m (m, m) float64 CPU, h = the trailing subdiagonal entry, m).
    m < dim after a breakdown (then h = 0).
    """
    basis = [start / torch.linalg.vector_norm(start)]
    hess = torch.zeros(dim + 1, dim, dtype=torch.float64)
    for j in range(dim):
        w = matvec(basis[j])
        scale = float(torch.linalg.vector_norm(w))
        w, coeffs = _orthogonalise(basis, w)
        hess[: j + 1, j] = coeffs
        h = float(torch.linalg.vector_norm(w))
        hess[j + 1, j] = h
        if h <= _BREAKDOWN * scale or h == 0.0:
            return torch.stack(basis), hess[: j + 1, : j + 1], 0.0, j + 1
        if j + 1 < dim:
            basis.append(w / h)
    return torch.stack(basis), hess[:dim, :dim], float(hess[dim, dim - 1]), dim


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
    basis = [start / torch.linalg.vector_norm(start)]
    alphas: list[float] = []
    betas: list[float] = []
    for j in range(steps):
        w = matvec(basis[j])
        scale = float(torch.linalg.vector_norm(w))
        w, coeffs = _orthogonalise(basis, w)
        alphas.append(float(coeffs[j]))
        beta = float(torch.linalg.vector_norm(w))
        if beta <= _BREAKDOWN * scale or beta == 0.0 or j + 1 == steps:
            break
        betas.append(beta)
        basis.append(w / beta)
    m = len(alphas)
    tri = torch.diag(torch.tensor(alphas, dtype=torch.float64))
    off = torch.tensor(betas[: m - 1], dtype=torch.float64)
    tri += torch.diag(off, 1) + torch.diag(off, -1)
    values, vectors = torch.linalg.eigh(tri)
    q = torch.stack(basis[:m])
    smallest_vector = q.T @ vectors[:, 0].to(q.device, q.dtype)
    return LanczosEstimate(float(values[0]), float(values[-1]), smallest_vector, m)
