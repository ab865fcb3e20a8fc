"""Truncated SVD by subspace (orthogonal) iteration: a decomposition beyond the paper.

It is added only through the public plug-in API (``Decomposition`` + ``register_decomposition``),
as a user would add one; nothing in the core knows about it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from implicit_ham._core.precision import working_dtype
from implicit_ham.decompositions.base import Decomposition, State
from implicit_ham.decompositions.registry import register_decomposition


def orthonormalize(a: Tensor) -> Tensor:
    """(..., d, r) -> Q (..., d, r): the reduced QR ``a = Q R`` with ``diag(R) >= 0``.

    Fixing the signs makes the factor unique, so the subspace iteration has a genuine fixed
    point (not one up to column signs). float16 / bfloat16 inputs are factorised in float32."""
    q, r = torch.linalg.qr(a.to(working_dtype(a.dtype)), mode="reduced")
    signs = torch.where(torch.diagonal(r, dim1=-2, dim2=-1) < 0, -1.0, 1.0).to(q.dtype)
    return (q * signs.unsqueeze(-2)).to(a.dtype)


@register_decomposition("svd")
class SVD(Decomposition):
    """Rank-r truncated SVD ham: the projection of X (B*S, d, n) on its top-r left singular
    subspace, ``X_r = D D^T X``.

    Initial bases: standard normal, then orthonormalised. With ``orth`` the sign-fixed QR
    factor (``orthonormalize``), the state (D (B*S, d, r), C (B*S, n, r)) evolves as::

        init:     D0 <- orth(D0),   C0 = X^T D0
        step:     C <- X^T D,       D <- orth(X C)        (= orth(X X^T D), one power step)
        readout:  C = X^T D,        X_r = D C^T = D D^T X

    The subspace (hence the output) converges linearly at rate ``(sigma_{r+1} / sigma_r)^2``;
    the bases themselves converge to the top-r left singular vectors (signs fixed by
    ``diag(R) > 0``) at rate ``max_{i<=r} (sigma_{i+1} / sigma_i)^2``; at the fixed point
    ``D^T X X^T D`` is diagonal. Every backward mode applies; with a spectral gap the fixed
    point is well conditioned, so the implicit gradient is accurate. ``inv_t`` is unused.
    """

    def init(self, x: Tensor, bases: Tensor) -> State:
        bases = orthonormalize(bases)
        return bases, x.transpose(1, 2) @ bases

    def step(self, x: Tensor, state: State) -> State:
        coef = x.transpose(1, 2) @ state[0]
        return orthonormalize(x @ coef), coef

    def compute_coef(self, x: Tensor, state: State) -> Tensor:
        return x.transpose(1, 2) @ state[0]
