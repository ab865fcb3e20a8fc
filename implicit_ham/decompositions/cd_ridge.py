"""Ridge CD: concept decomposition posed as the argmin of a ridge-regularised objective.

CD's iteration is exact block-coordinate descent on the soft spherical k-means objective

    L(D, C) = sum_j w_j [ -sum_k c_jk xh_j^T d_k + (1/inv_t) sum_k c_jk log c_jk ]

(``xh_j = x_j / s_j`` the unit pixel, ``s_j = max(||x_j||, norm_eps)``, ``w_j = s_j / sum_i s_i``,
each row c_j on the simplex) under the constraints ``||d_k|| = 1``: the minimiser over C is
``softmax_r(inv_t Xh^T D)`` (CD's coefficient step), the minimiser over a unit-norm d_k is
``normalize(X c_k)`` (CD's basis step). Ridge CD replaces the sphere constraints by a ridge term
and eliminates C, leaving the unconstrained, smooth objective in D alone

    Psi(D) = -(r / inv_t) sum_j w_j logsumexp_k(inv_t xh_j^T d_k) + (lam / 2) ||D||_F^2,
    grad Psi(D) = lam D - (r / sum_i s_i) X C,   C = softmax_r(inv_t Xh^T D).

One iteration is a gradient step with step size ``1 / lam``, ``D <- D - grad Psi(D) / lam``,
which is CD's block update with ``normalize_d`` replaced by the fixed scale
``r / (lam sum_i s_i)``; its fixed points are exactly the stationary points of Psi, and there
``I - J = H / lam`` (H the Hessian of Psi), so ``Implicit`` differentiates the optimality
condition ``grad Psi = 0``. The readout is CD's: the ridge regression ``C = X^T D (D^T D +
beta I)^-1``, itself the argmin of ``||X - D C^T||^2 + beta ||C||^2`` for the final D.

Relation to CD, precisely: a CD fixed point D is a stationary point of Psi on the unit spheres
with the multipliers ``lam_k = r ||X c_k|| / sum_i s_i`` (one per concept); ridge CD fixes
one ``lam`` for all concepts instead, so its concepts point where CD's would for the same
assignments but have norms ``r ||X c_k|| / (lam sum_i s_i) <= r pi_k / lam`` (``pi_k`` the
concept's share of the pixel mass), which act as per-concept inverse temperatures.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..validation import check_tolerance
from .base import State
from .cd import CD
from .fused import column_norms, normalized_similarity
from .registry import register_decomposition

Invariants = tuple[Tensor, Tensor]


@register_decomposition("cd_ridge")
class RidgeCD(CD):
    """Ridge CD ham: concepts D (B*S, d, r) minimising ``Psi`` (module docstring), coefficients
    C (B*S, n, r) = ``softmax_r(inv_t Xh^T D)`` in the state, CD's ridge readout.

    One iteration (a gradient step of size ``1 / lam`` on Psi)::

        C <- softmax_r(inv_t * normalize_d(X)^T D)
        D <- (r / (lam * sum_j max(||x_j||, norm_eps))) * X C

    Initialisation, ``inv_t`` (100) and the readout (``beta``) are CD's; ``objective`` is Psi.

    Args:
        lam: the ridge weight on the concepts (> 0). ``lam = 1`` gives concepts of norm at
            most ``r pi_k``, about CD's unit norm for balanced concepts; a smaller ``lam``
            sharpens the assignments, a larger one softens them.
        beta: the readout's ridge, as CD's; the other arguments are ``Decomposition``'s.
    """

    def __init__(self, rank: int = 64, *, lam: float = 1.0, **kwargs: object) -> None:
        super().__init__(rank, **kwargs)  # type: ignore[arg-type]
        check_tolerance("RidgeCD", "lam", lam)
        self.lam = float(lam)

    def loop_invariants(self, x: Tensor) -> Invariants:  # type: ignore[override]
        """``inv_t / s_j`` (B*S, n, 1), the scale of the logits, and ``r / (lam sum_j s_j)``
        (B*S, 1, 1), the scale of the basis step."""
        norms = column_norms(x).clamp_min(self.norm_eps)
        return self.inv_t / norms, self.rank / (self.lam * norms.sum(dim=1, keepdim=True))

    def step_with(self, x: Tensor, state: State, invariants: Invariants) -> State:  # type: ignore[override]
        logit_scale, basis_scale = invariants
        coef = torch.softmax(normalized_similarity(x, state[0], logit_scale), dim=-1)
        return (x @ coef) * basis_scale, coef

    def objective(self, x: Tensor, state: State) -> Tensor:
        """(B*S,): ``Psi(D)`` of the state's concepts D (the coefficients follow from D)."""
        bases = state[0]
        norms = column_norms(x).clamp_min(self.norm_eps)
        weights = norms / norms.sum(dim=1, keepdim=True)  # (B*S, n, 1)
        logits = normalized_similarity(x, bases, self.inv_t / norms)
        fit = (weights.squeeze(-1) * torch.logsumexp(logits, dim=-1)).sum(dim=1)
        return -(self.rank / self.inv_t) * fit + 0.5 * self.lam * bases.square().sum(dim=(1, 2))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, lam={self.lam:g}"
