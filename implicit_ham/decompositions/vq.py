"""Vector quantisation: soft k-means with cosine similarity (Hamburger's VQ)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from implicit_ham.decompositions.base import Decomposition, State
from implicit_ham.decompositions.fused import column_norms, normalize_over_n, similarity_softmax
from implicit_ham.decompositions.registry import register_decomposition


@register_decomposition("vq")
class VQ(Decomposition):
    """VQ ham: r soft cluster centres D (B*S, d, r) of the n columns of X (B*S, d, n).

    Initial bases standard normal, L2-normalised over d; ``C0 = softmax_r(inv_t X^T D0)``,
    ``inv_t = 100``. With ``normalize_d(v) = v / max(||v||_d, eps)``
    (``norm_eps`` for the columns of X, as ``F.normalize`` in the official code), one iteration::

        C <- softmax_r(inv_t * normalize_d(X)^T normalize_d(D))     (rows sum to 1 over r)
        C <- C / (sum_n C + eps)                                      (columns sum to ~1 over n)
        D <- X C

    ``compute_coef``: ``C = softmax_r(inv_t * (X / (||X||_d + eps))^T normalize_d(D))`` with
    ``||X||_d`` taken without gradient; the readout is ``D C^T``. See ``Decomposition`` for the
    gradient semantics.

    Evaluation: ``normalize_d(X)^T D`` is computed as ``(X^T D) * s`` with the per-pixel scale
    ``s = 1 / max(||x_j||, norm_eps)`` (the ``loop_invariants``, computed once per solve), so no
    normalised copy of X (B*S, d, n) is made and X is read twice per iteration, by the two
    products; temporaries are updated in place when autograd does not need them. In float16 /
    bfloat16 (or under autocast) the logits and the softmax run in float32 (``similarity_softmax``):
    at ``inv_t = 100`` bfloat16 logits reshuffle the assignments.
    """

    default_inv_t = 100.0
    exact_unroll = False  # compute_coef holds ||X||_d constant (the official readout)

    def assignments(self, x: Tensor, bases: Tensor) -> Tensor:
        """Soft assignments ``softmax_r(inv_t * normalize_d(X)^T normalize_d(D))`` (B*S, n, r);
        each row sums to 1 over r."""
        return self._assignments(x, bases, self.loop_invariants(x))

    def loop_invariants(self, x: Tensor) -> Tensor:
        """``inv_t / max(||x_j||, norm_eps)`` (B*S, n, 1), the scale of the logits."""
        return self.inv_t / column_norms(x).clamp_min(self.norm_eps)

    def step(self, x: Tensor, state: State) -> State:
        return self.step_with(x, state, self.loop_invariants(x))

    def step_with(self, x: Tensor, state: State, invariants: Tensor) -> State:
        coef = normalize_over_n(self._assignments(x, state[0], invariants), self.eps)
        return torch.bmm(x, coef), coef

    def compute_coef(self, x: Tensor, state: State) -> Tensor:
        scale = self.inv_t / (column_norms(x.detach()) + self.eps)
        bases = F.normalize(state[0], dim=1, eps=self.eps)
        return similarity_softmax(x, bases, scale)

    def _assignments(self, x: Tensor, bases: Tensor, scale: Tensor) -> Tensor:
        bases = F.normalize(bases, dim=1, eps=self.eps)
        return similarity_softmax(x, bases, scale)
