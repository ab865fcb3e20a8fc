"""Ridge CD: concept decomposition posed as the argmin of a ridge-regularised objective.

With ``s_j = max(||x_j||, norm_eps)``, the unit pixels ``xh_j = x_j / s_j`` and the weights
``w_j = s_j / sum_i s_i``, take the energy (each row c_j of C on the simplex)

    L(D, C) = sum_j w_j [ sum_k c_jk (-xh_j^T d_k + (lam / 2) ||d_k||^2)
                          + (1 / inv_t) sum_k c_jk log c_jk ].

On the unit spheres ``||d_k|| = 1`` the ridge term is the constant ``lam / 2`` and CD's
iteration is exact block-coordinate descent on L: the minimiser over C is
``softmax_r(inv_t Xh^T D)`` (CD's coefficient step), the minimiser over a unit d_k is
``normalize(X c_k)`` (CD's basis step). Ridge CD drops the sphere constraint and keeps the
ridge: the same two exact block minimisations, now

    C <- softmax_r(inv_t (Xh^T D - (lam / 2) ||d_k||^2)),
    d_k <- X c_k / (lam m_k),   m_k = sum_j c_jk s_j   (the concept's pixel mass),

so CD's ``normalize(X c_k)`` (division by ``||X c_k||``) becomes a division by ``lam m_k >=
lam ||X c_k||``: every concept is ``1 / lam`` times the weighted mean of its unit pixels (norm at
most ``1 / lam``; ``lam = 1`` is EM for an isotropic Gaussian mixture of variance ``1 / inv_t``
on the unit pixels). Eliminating C leaves the smooth, unconstrained objective

    Psi(D) = -(1 / inv_t) sum_j w_j logsumexp_k(inv_t (xh_j^T d_k - (lam / 2) ||d_k||^2)),
    grad_{d_k} Psi = (lam m_k d_k - X c_k) / sum_i s_i,

and the basis step is ``d_k <- d_k - grad_{d_k} Psi / (lam pi_k)``, ``pi_k = m_k / sum_i s_i``:
a gradient step preconditioned by the concept masses. Its fixed points are exactly the
stationary points of Psi, where ``I - dD'/dD = P^-1 H`` (H the Hessian of Psi,
``P = lam diag(pi_k)``), so ``Implicit`` differentiates the optimality condition
``grad Psi = 0``. The readout is CD's ridge regression ``C = X^T D (D^T D + beta I)^-1``, the
argmin of ``||X - D C^T||^2 + beta ||C||^2`` for the final D.

Relation to CD, precisely: CD's fixed points are the stationary points of Psi restricted to the
unit spheres (any lam); ridge CD's are the unconstrained ones. They coincide where every
concept's mean unit pixel has norm ``lam``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from implicit_ham._core.validation import check_tolerance
from implicit_ham.decompositions.base import State
from implicit_ham.decompositions.cd import CD
from implicit_ham.decompositions.fused import column_norms, normalized_similarity
from implicit_ham.decompositions.registry import register_decomposition

Invariants = tuple[Tensor, Tensor, Tensor]


@register_decomposition("cd_ridge")
class RidgeCD(CD):
    """Ridge CD ham: concepts D (B*S, d, r) minimising ``Psi`` (module docstring), coefficients
    C (B*S, n, r) on the simplex in the state, CD's ridge readout.

    One iteration, with ``s_j = max(||x_j||, norm_eps)``::

        C   <- softmax_r(inv_t * (normalize_d(X)^T D - (lam / 2) ||d_k||^2))
        d_k <- X c_k / (lam * (sum_j c_jk s_j + eps * sum_j s_j))

    (``eps`` keeps a concept without pixels finite). Initialisation, ``inv_t`` (100) and the
    readout (``beta``) are CD's; ``objective`` is Psi.

    Args:
        lam: the ridge weight on the concepts (> 0): they have norm at most ``1 / lam``.
        beta: the readout's ridge, as CD's; the other arguments are ``Decomposition``'s.
    """

    def __init__(self, rank: int = 64, *, lam: float = 1.0, **kwargs: object) -> None:
        super().__init__(rank, **kwargs)  # type: ignore[arg-type]
        check_tolerance("RidgeCD", "lam", lam)
        self.lam = float(lam)

    def loop_invariants(self, x: Tensor) -> Invariants:  # type: ignore[override]
        """``inv_t / s_j`` (B*S, n, 1) (the scale of the logits), ``s_j`` (B*S, n, 1) and
        ``eps * sum_j s_j`` (B*S, 1, 1) (the floor of the concept masses)."""
        norms = column_norms(x).clamp_min(self.norm_eps)
        return self.inv_t / norms, norms, self.eps * norms.sum(dim=1, keepdim=True)

    def step_with(self, x: Tensor, state: State, invariants: Invariants) -> State:  # type: ignore[override]
        logit_scale, norms, floor = invariants
        coef = torch.softmax(self._logits(x, state[0], logit_scale), dim=-1)
        mass = (coef * norms).sum(dim=1, keepdim=True)  # (B*S, 1, r)
        return (x @ coef) / (self.lam * (mass + floor)), coef

    def objective(self, x: Tensor, state: State) -> Tensor:
        """(B*S,): ``Psi(D)`` of the state's concepts D (the coefficients follow from D)."""
        norms = column_norms(x).clamp_min(self.norm_eps)
        weights = (norms / norms.sum(dim=1, keepdim=True)).squeeze(-1)  # (B*S, n)
        logits = self._logits(x, state[0], self.inv_t / norms)
        return -(weights * torch.logsumexp(logits, dim=-1)).sum(dim=1) / self.inv_t

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, lam={self.lam:g}"

    def _logits(self, x: Tensor, bases: Tensor, logit_scale: Tensor) -> Tensor:
        """(B*S, n, r): ``inv_t (xh_j^T d_k - (lam / 2) ||d_k||^2)``."""
        ridge = (0.5 * self.inv_t * self.lam) * bases.square().sum(dim=1, keepdim=True)
        return normalized_similarity(x, bases, logit_scale) - ridge
