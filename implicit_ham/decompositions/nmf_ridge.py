"""Ridge-regularised NMF posed as an argmin problem, solved by projected gradient.

NMF's multiplicative updates have a singular ``I - J`` at their fixed points (the scaling
symmetry ``(D, C) -> (D L, C L^-1)`` and, at interior points, all of GL(r); see
``NormalizedNMF``). The ridge term of

    min_{D, C >= 0}  ||X - D C^T||_F^2 + lam (||D||_F^2 + ||C||_F^2)

breaks the scaling part (the optimum balances ``||d_k|| = ||c_k||``); only rotations that keep
the factors non-negative remain, and they are blocked wherever a factor has zeros. The layer is
a ``Decomposition`` (a ham through the plug-in API): one iteration is a projected-gradient step
on C, then on D, whose fixed point is the problem's KKT point, so ``Implicit`` differentiates
the minimum (the projected fixed point, as ``ih.minimize(..., constraint=NonNegative())``).
"""

from __future__ import annotations

from torch import Tensor

from implicit_ham._core.validation import check_tolerance
from implicit_ham.decompositions.base import State
from implicit_ham.decompositions.nmf import NMF
from implicit_ham.decompositions.registry import register_decomposition


@register_decomposition("nmf_ridge")
class RidgeNMF(NMF):
    """Ridge-regularised NMF: states (D (B*S, d, r), C (B*S, n, r)), both >= 0.

    One iteration, with ``G_C = C D^T D - X^T D + lam C`` (half the gradient in C) and the step
    ``1 / L_C``, ``L_C = ||D^T D||_F + lam`` (an upper bound of the gradient's Lipschitz
    constant), then the same for D with the new C::

        C <- max(C - G_C / L_C, 0)
        D <- max(D - G_D / L_D, 0),   G_D = D C^T C - X C + lam D,  L_D = ||C^T C||_F + lam

    ``compute_coef`` is one more C step; the readout is ``D C^T``; the ``objective`` is the
    regularised loss above. Initialisation and the input check are NMF's.

    Args:
        lam: the ridge weight (> 0); the other arguments are ``Decomposition``'s.
    """

    def __init__(self, rank: int = 64, *, lam: float = 0.1, **kwargs: object) -> None:
        super().__init__(rank, **kwargs)  # type: ignore[arg-type]
        check_tolerance("RidgeNMF", "lam", lam)
        self.lam = float(lam)

    def step(self, x: Tensor, state: State) -> State:
        bases, coef = state
        coef = self._coef_step(x, bases, coef)
        gram = coef.mT @ coef
        grad = bases @ gram - x @ coef + self.lam * bases
        return (bases - grad / self._lipschitz(gram)).clamp_min(0), coef

    def compute_coef(self, x: Tensor, state: State) -> Tensor:
        return self._coef_step(x, *state)

    def objective(self, x: Tensor, state: State) -> Tensor:
        """(B*S,): ``||X - D C^T||_F^2 + lam (||D||_F^2 + ||C||_F^2)`` with the state's C."""
        bases, coef = state
        fit = (x - bases @ coef.mT).square().sum(dim=(1, 2))
        return fit + self.lam * (bases.square().sum(dim=(1, 2)) + coef.square().sum(dim=(1, 2)))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, lam={self.lam:g}"

    def _coef_step(self, x: Tensor, bases: Tensor, coef: Tensor) -> Tensor:
        gram = bases.mT @ bases
        grad = coef @ gram - x.mT @ bases + self.lam * coef
        return (coef - grad / self._lipschitz(gram)).clamp_min(0)

    def _lipschitz(self, gram: Tensor) -> Tensor:
        """(B*S, 1, 1): ``||gram||_F + lam``."""
        return gram.square().sum(dim=(1, 2), keepdim=True).sqrt() + self.lam
