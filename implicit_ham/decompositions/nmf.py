"""Non-negative matrix factorisation by Lee & Seung's multiplicative updates (Hamburger's NMF)."""

from __future__ import annotations

import torch
from torch import Tensor

from implicit_ham.decompositions.base import Decomposition, State
from implicit_ham.decompositions.fused import multiplicative_update
from implicit_ham.decompositions.products import bases_t_x, readout_in_blocks
from implicit_ham.decompositions.registry import register_decomposition


@register_decomposition("nmf")
class NMF(Decomposition):
    """NMF ham: X ~ D C^T with D, C >= 0, for a non-negative X (B*S, d, n).

    Initial bases uniform in [0, 1), L2-normalised over d; ``C0 = softmax_r(X^T D0)``
    (``inv_t = 1``). One iteration (``eps = 1e-6``)::

        C <- C * (X^T D) / (C D^T D + eps)
        D <- D * (X C) / (D C^T C + eps)

    ``compute_coef`` is one more C update; the readout is ``D C^T``. The updates never
    increase ``||X - D C^T||_F^2`` (the ``objective``). See ``Decomposition`` for the
    gradient semantics; the paper's one-step gradient reaches X only through the final C
    update, with D_K and C_K held constant.

    Evaluation order (the same in every gradient mode, so the forward value never depends on
    the backward mode): the r x r Gram matrices ``D^T D`` and ``C^T C`` are formed first, so
    the only products of size d x n x r are ``X^T D``, ``X C`` and the readout; C is kept in
    an (r, n) memory layout (a transposed view, see ``_update_coef``); temporaries are updated
    in place when autograd does not need them (see ``fused``); the quotient is
    ``((X^T D) * C) / (C D^T D + eps)``. The products are plain ``torch.bmm`` calls on the
    3-D operands (no ``matmul`` reshaping per product), and ``X^T D0``, formed once for
    ``C0 = softmax_r(X^T D0)``, is handed to the first C update (``init_shared``) instead of
    being recomputed: 14 products of size d x n x r per 6-step forward instead of 15. In an
    inference forward (no operand requires grad) on the CPU, ``X^T D`` is taken in column blocks
    for a wide X (``products.bases_t_x``), and so is the readout (``products.readout_in_blocks``:
    no n x r coefficient tensor beside the state ``last_solution`` keeps). The input's
    finiteness and non-negativity are checked in one pass (``check_values``).
    """

    default_inv_t = 1.0
    nonnegative = True

    def sample_bases(self, shape: tuple[int, ...], like: Tensor) -> Tensor:
        """Uniform [0, 1) bases (non-negative, as NMF needs)."""
        return torch.rand(shape, device=like.device, dtype=like.dtype)

    def init(self, x: Tensor, bases: Tensor) -> State:
        return self.init_shared(x, bases)[0]

    def init_shared(self, x: Tensor, bases: Tensor) -> tuple[State, Tensor]:
        """``(D0, softmax_r(inv_t X^T D0))`` and ``X^T D0`` (B*S, n, r), formed as the first C
        update forms it (``(D0^T X)^T``, (r, n) layout), for that update to reuse."""
        product = bases_t_x(bases, x)  # (B*S, r, n)
        logits = product if self.inv_t == 1.0 else self.inv_t * product
        return (bases, torch.softmax(logits, dim=1).mT), product.mT

    def step(self, x: Tensor, state: State) -> State:
        bases, coef = state
        coef = self._update_coef(x, bases, coef)
        numer = torch.bmm(x, coef)
        denom = torch.bmm(bases, torch.bmm(coef.mT, coef))
        return multiplicative_update(bases, numer, denom, self.eps), coef

    def compute_coef(self, x: Tensor, state: State) -> Tensor:
        return self._update_coef(x, *state)

    def objective(self, x: Tensor, state: State) -> Tensor:
        """(B*S,): ``||X - D C^T||_F^2`` with the state's own C (what the updates decrease)."""
        bases, coef = state
        return (x - bases @ coef.transpose(1, 2)).square().sum(dim=(1, 2))

    def readout(self, x: Tensor, state: State) -> Tensor:
        """``D compute_coef(X, state)^T`` (B*S, d, n); in an inference forward on the CPU taken
        in column blocks (``products.readout_in_blocks``: the same value up to rounding,
        without an n x r coefficient tensor beside the state's)."""
        if type(self).compute_coef is NMF.compute_coef:
            bases = state[0]
            out = readout_in_blocks(
                x, bases, state[1], lambda xs, cs, gram: self._update_coef(xs, bases, cs, gram)
            )
            if out is not None:
                return out
        return super().readout(x, state)

    def _update_coef(
        self, x: Tensor, bases: Tensor, coef: Tensor, gram: Tensor | None = None
    ) -> Tensor:
        """``C * (X^T D) / (C D^T D + eps)``: (B*S, n, r), stored as its transpose (r, n);
        ``gram``: ``D^T D`` when the caller has it (the blocked readout forms it once).

        Both products are formed transposed, ``(D^T X)^T`` and ``(D^T D C^T)^T`` (the Gram
        matrix is symmetric), so the n x r temporaries and the result share the (r, n) layout
        (the elementwise update runs on matching memory) and the gradient of X, ``D G^T``, is
        produced in X's own (d, n) layout: no strided transpose copy of an (n, d) gradient in
        the backward pass (the official formulation's ``bmm(X^T, D)`` pays one per step).
        """
        numer = self.shared_product(bases, x)
        if numer is None:
            numer = bases_t_x(bases, x).mT
        gram = torch.bmm(bases.mT, bases) if gram is None else gram
        denom = torch.bmm(gram, coef.mT).mT
        return multiplicative_update(coef, numer, denom, self.eps)
