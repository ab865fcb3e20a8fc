"""Concept decomposition: spherical k-means bases, ridge-regression coefficients (CD)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from implicit_ham._core.precision import working_dtype
from implicit_ham._core.validation import check_tolerance
from implicit_ham.decompositions.base import Decomposition, State
from implicit_ham.decompositions.fused import column_norms, normalize_over_n, similarity_softmax
from implicit_ham.decompositions.registry import register_decomposition


@register_decomposition("cd")
class CD(Decomposition):
    """CD ham: unit-norm concept vectors D (B*S, d, r), least-squares coefficients.

    Initial bases standard normal, L2-normalised over d; ``C0 = softmax_r(inv_t X^T D0)``,
    ``inv_t = 100``. With ``normalize_d(v) = v / max(||v||_d, eps)``
    (``norm_eps`` for the columns of X, as ``F.normalize`` in the official code), one iteration::

        C <- softmax_r(inv_t * normalize_d(X)^T D)
        C <- C / (sum_n C + eps)
        D <- normalize_d(X C)                          (every basis has unit norm)

    ``compute_coef`` is the ridge regression ``C = X^T D (D^T D + beta I_r)^{-1}``, ``beta = 0.1``,
    with the r x r inverse formed explicitly as in the official code (well conditioned); the
    readout is ``D C^T``. See ``Decomposition`` for the gradient semantics. Like ``VQ``, the
    iteration scales ``X^T D`` by ``1 / max(||x_j||, norm_eps)`` (the ``loop_invariants``, once
    per solve) instead of normalising a copy of X per iteration.

    Args:
        beta: the ridge parameter (> 0); the other arguments are ``Decomposition``'s.
    """

    default_inv_t = 100.0

    def __init__(self, rank: int = 64, *, beta: float = 0.1, **kwargs: object) -> None:
        super().__init__(rank, **kwargs)  # type: ignore[arg-type]
        check_tolerance("CD", "beta", beta)
        self.beta = float(beta)

    def loop_invariants(self, x: Tensor) -> Tensor:
        """``inv_t / max(||x_j||, norm_eps)`` (B*S, n, 1), the scale of the logits."""
        return self.inv_t / column_norms(x).clamp_min(self.norm_eps)

    def step(self, x: Tensor, state: State) -> State:
        return self.step_with(x, state, self.loop_invariants(x))

    def step_with(self, x: Tensor, state: State, invariants: Tensor) -> State:
        coef = similarity_softmax(x, state[0], invariants)
        coef = normalize_over_n(coef, self.eps)
        return F.normalize(torch.bmm(x, coef), dim=1, eps=self.eps), coef

    def compute_coef(self, x: Tensor, state: State) -> Tensor:
        """``C^T = (D^T D + beta I)^-1 (D^T X)`` (B*S, n, r): the r x r inverse is well
        conditioned (unit-norm bases, beta > 0), and backward keeps only it and D (which the
        readout keeps anyway), as the official code; in float32 for half states."""
        bases = state[0]
        dtype = working_dtype(bases.dtype)
        eye = torch.eye(self.rank, device=bases.device, dtype=dtype)
        system = (bases.transpose(1, 2) @ bases).to(dtype) + self.beta * eye
        inverse = torch.linalg.inv(system).to(bases.dtype)
        return (inverse @ (bases.transpose(1, 2) @ x)).transpose(1, 2)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, beta={self.beta:g}"
