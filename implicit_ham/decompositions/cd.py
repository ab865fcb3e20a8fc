"""Concept decomposition: spherical k-means bases, ridge-regression coefficients (CD)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..validation import check_tolerance
from .base import Decomposition, State
from .registry import register_decomposition


@register_decomposition("cd")
class CD(Decomposition):
    """CD ham: unit-norm concept vectors D (B*S, d, r), least-squares coefficients.

    Initial bases standard normal, L2-normalised over d; ``C0 = softmax_r(inv_t X^T D0)``,
    ``inv_t = 100``. With ``normalize_d(v) = v / max(||v||_d, eps)``, one iteration::

        C <- softmax_r(inv_t * normalize_d(X)^T D)
        C <- C / (sum_n C + eps)
        D <- normalize_d(X C)                          (every basis has unit norm)

    ``compute_coef`` is the ridge regression ``C = X^T D (D^T D + beta I_r)^{-1}``, computed as
    a linear solve (no explicit inverse), ``beta = 0.1``; the readout is ``D C^T``. See
    ``Decomposition`` for the gradient semantics.

    Args:
        beta: the ridge parameter (> 0); the other arguments are ``Decomposition``'s.
    """

    default_inv_t = 100.0

    def __init__(self, rank: int = 64, *, beta: float = 0.1, **kwargs: object) -> None:
        super().__init__(rank, **kwargs)  # type: ignore[arg-type]
        check_tolerance("CD", "beta", beta)
        self.beta = float(beta)

    def step(self, x: Tensor, state: State) -> State:
        similarity = F.normalize(x, dim=1, eps=self.eps).transpose(1, 2) @ state[0]
        coef = torch.softmax(self.inv_t * similarity, dim=-1)
        coef = coef / (coef.sum(dim=1, keepdim=True) + self.eps)
        return F.normalize(x @ coef, dim=1, eps=self.eps), coef

    def compute_coef(self, x: Tensor, state: State) -> Tensor:
        bases = state[0]
        eye = torch.eye(self.rank, device=bases.device, dtype=bases.dtype)
        system = bases.transpose(1, 2) @ bases + self.beta * eye
        return torch.linalg.solve(system, bases.transpose(1, 2) @ x).transpose(1, 2)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, beta={self.beta:g}"
