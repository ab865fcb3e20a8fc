"""Vector quantisation: soft k-means with cosine similarity (Hamburger's VQ)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import Decomposition, State
from .registry import register_decomposition


@register_decomposition("vq")
class VQ(Decomposition):
    """VQ ham: r soft cluster centres D (B*S, d, r) of the n columns of X (B*S, d, n).

    Initial bases standard normal, L2-normalised over d; ``C0 = softmax_r(inv_t X^T D0)``,
    ``inv_t = 100``. With ``normalize_d(v) = v / max(||v||_d, eps)``, one iteration::

        C <- softmax_r(inv_t * normalize_d(X)^T normalize_d(D))     (rows sum to 1 over r)
        C <- C / (sum_n C + eps)                                      (columns sum to ~1 over n)
        D <- X C

    ``compute_coef``: ``C = softmax_r(inv_t * (X / (||X||_d + eps))^T normalize_d(D))`` with
    ``||X||_d`` taken without gradient; the readout is ``D C^T``. See ``Decomposition`` for the
    gradient semantics.
    """

    default_inv_t = 100.0

    def assignments(self, x: Tensor, bases: Tensor) -> Tensor:
        """Soft assignments ``softmax_r(inv_t * normalize_d(X)^T normalize_d(D))`` (B*S, n, r);
        each row sums to 1 over r."""
        similarity = F.normalize(x, dim=1, eps=self.eps).transpose(1, 2) @ F.normalize(
            bases, dim=1, eps=self.eps
        )
        return torch.softmax(self.inv_t * similarity, dim=-1)

    def step(self, x: Tensor, state: State) -> State:
        coef = self.assignments(x, state[0])
        coef = coef / (coef.sum(dim=1, keepdim=True) + self.eps)
        return x @ coef, coef

    def compute_coef(self, x: Tensor, state: State) -> Tensor:
        norm = torch.linalg.vector_norm(x.detach(), dim=1, keepdim=True)
        similarity = (x / (norm + self.eps)).transpose(1, 2) @ F.normalize(
            state[0], dim=1, eps=self.eps
        )
        return torch.softmax(self.inv_t * similarity, dim=-1)
