"""Plain reference formulations of NMF, VQ and CD, written literally from the equations.

Each computes the same function as its optimised layer (``NMF``, ``VQ``, ``CD``; equal up to
rounding) with the same gradient semantics, and exists to measure what the optimisations buy
(``experiments/benchmarks/blocks.py``) and to test the optimised code against. They are deliberately
plain:
products are evaluated left to right as the equations are written (NMF's ``C D^T D`` builds the
n x d matrix ``C D^T`` first, so no r x r Gram matrix is reused), transposes and the normalised
copy of X are recomputed inside every iteration, nothing is updated in place, and CD's ridge
regression uses an explicit inverse. They are not registered: build them directly.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from implicit_ham.decompositions.base import Decomposition, State
from implicit_ham.decompositions.cd import CD
from implicit_ham.decompositions.nmf import NMF
from implicit_ham.decompositions.vq import VQ


class PlainIteration(Decomposition):
    """Mixin: no loop invariants, every iteration is the plain ``step`` (which recomputes
    whatever it needs from X)."""

    def loop_invariants(self, x: Tensor) -> Any:
        return None

    def step_with(self, x: Tensor, state: State, invariants: object) -> State:
        return self.step(x, state)


class ReferenceNMF(NMF):
    """``NMF`` as written: ``C <- C * (X^T D) / (C D^T D + eps)``, ``D <- D * (X C) /
    (D C^T C + eps)`` evaluated left to right; ``compute_coef`` is one more C update."""

    def step(self, x: Tensor, state: State) -> State:
        bases, coef = state
        coef = self.compute_coef(x, state)
        bases = bases * (x @ coef) / (bases @ coef.transpose(1, 2) @ coef + self.eps)
        return bases, coef

    def compute_coef(self, x: Tensor, state: State) -> Tensor:
        bases, coef = state
        numer = x.transpose(1, 2) @ bases
        return coef * numer / (coef @ bases.transpose(1, 2) @ bases + self.eps)


class ReferenceVQ(PlainIteration, VQ):
    """``VQ`` as written: X and D are normalised (new copies) in every iteration."""

    def assignments(self, x: Tensor, bases: Tensor) -> Tensor:
        x_unit = F.normalize(x, dim=1, eps=self.norm_eps)
        d_unit = F.normalize(bases, dim=1, eps=self.eps)
        return torch.softmax(self.inv_t * (x_unit.transpose(1, 2) @ d_unit), dim=-1)

    def step(self, x: Tensor, state: State) -> State:
        coef = self.assignments(x, state[0])
        coef = coef / (coef.sum(dim=1, keepdim=True) + self.eps)
        return x @ coef, coef

    def compute_coef(self, x: Tensor, state: State) -> Tensor:
        norm = torch.linalg.vector_norm(x.detach(), dim=1, keepdim=True)
        x_unit = x / (norm + self.eps)
        d_unit = F.normalize(state[0], dim=1, eps=self.eps)
        return torch.softmax(self.inv_t * (x_unit.transpose(1, 2) @ d_unit), dim=-1)


class ReferenceCD(PlainIteration, CD):
    """``CD`` as written: X normalised (a new copy) in every iteration; the final coefficients
    ``X^T D (D^T D + beta I)^-1`` with an explicit inverse."""

    def step(self, x: Tensor, state: State) -> State:
        x_unit = F.normalize(x, dim=1, eps=self.norm_eps)
        coef = torch.softmax(self.inv_t * (x_unit.transpose(1, 2) @ state[0]), dim=-1)
        coef = coef / (coef.sum(dim=1, keepdim=True) + self.eps)
        return F.normalize(x @ coef, dim=1, eps=self.eps), coef

    def compute_coef(self, x: Tensor, state: State) -> Tensor:
        bases = state[0]
        eye = torch.eye(self.rank, device=bases.device, dtype=bases.dtype)
        inverse = torch.linalg.inv(bases.transpose(1, 2) @ bases + self.beta * eye)
        return x.transpose(1, 2) @ bases @ inverse
