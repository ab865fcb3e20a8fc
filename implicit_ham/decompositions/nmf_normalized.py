"""NMF with unit-norm bases: the same output as ``NMF``, without its scaling symmetry.

Why: NMF's multiplicative updates are equivariant under ``(D, C) -> (D L, C L^-1)`` for any
positive diagonal ``L``, so every fixed point lies on an r-dimensional family of fixed points,
the iteration's Jacobian J has the eigenvalue 1 along it and ``I - J`` is singular: implicit
differentiation has no unique answer (docs/results.md, question 2). Rescaling each basis to
unit L2 norm after every iteration (and each coefficient column by the inverse) picks one
point of each scaling orbit: ``D C^T`` is what ``NMF`` computes from the same initial state,
and J maps the scaling directions to 0. This is only part of the symmetry: at an interior fixed
point J keeps r^2 - r unit eigenvalues and I - J stays singular (see the class docstring).
"""

from __future__ import annotations

from torch import Tensor

from implicit_ham.decompositions.base import State
from implicit_ham.decompositions.nmf import NMF
from implicit_ham.decompositions.registry import register_decomposition


@register_decomposition("nmf_normalized")
class NormalizedNMF(NMF):
    """``NMF`` whose iteration ends with ``d_k <- d_k / ||d_k||``, ``c_k <- c_k ||d_k||`` for each
    basis k (norms clamped below by ``eps``); states are (D (B*S, d, r), C (B*S, n, r)).

    The readout ``D C^T`` and the objective are NMF's, and NMF's iterates are the normalised
    ones rescaled, so the two layers' outputs agree but for the ``eps`` of the divisions (not
    scale-invariant; relative differences ~1e-6 at ``eps = 1e-6``); the gradient of the
    paper's one-step mode differs (the final C update sees unit-norm bases).

    Measured (tests/lib/decompositions/test_nmf_normalized.py): this removes only part of the
    symmetry.
    At an interior fixed point every ``(D M, C M^-T)`` with M near I is an equally good
    factorisation, so NMF's J has r^2 unit eigenvalues; unit-norm bases remove r of them.
    """

    def step(self, x: Tensor, state: State) -> State:
        bases, coef = super().step(x, state)
        norms = bases.norm(dim=1, keepdim=True).clamp_min(self.eps)
        return bases / norms, coef * norms
