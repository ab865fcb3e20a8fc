"""Robust losses of ``least_squares``: ``½ C² Σ ρ(r_i² / C²)`` instead of ``½ Σ r_i²``.

The convention is scipy's (``scipy.optimize.least_squares(loss=..., f_scale=C)``): ρ acts on
the squared residual scaled by ``C²`` and ``ρ(s) ≈ s`` for small s, so every loss agrees with
the plain sum of squares for residuals much smaller than C. Gauss-Newton and
Levenberg-Marquardt minimise them by iteratively reweighted least squares: at each step the
residuals get the weights ``ρ'(r² / C²)`` (the gradient of the robust cost is
``Jᵀ diag(ρ') r``), so the minimiser is a root of that gradient, the optimality condition the
implicit backward pass differentiates.

==========  =================================  =========================
kind        ρ(s)                               ρ'(s)
==========  =================================  =========================
linear      s                                  1
huber       s (s <= 1), 2 √s − 1               1, 1 / √s
soft_l1     2 (√(1 + s) − 1)                   1 / √(1 + s)
cauchy      log(1 + s)                         1 / (1 + s)
arctan      arctan(s)                          1 / (1 + s²)
tukey       (1 − (1 − s)³) / 3 (s <= 1), 1/3   (1 − s)², 0
==========  =================================  =========================

Tukey's biweight is not convex: residuals beyond C get weight 0 and no gradient, so a start
far from the inliers' fit can stall; start from a Huber or plain fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from implicit_ham._core.validation import check_choice

LOSSES = ("linear", "huber", "soft_l1", "cauchy", "arctan", "tukey")


@dataclass(frozen=True)
class RobustLoss:
    """A robust loss ρ with its scale C (see the module docstring).

    Args:
        kind: one of ``LOSSES``.
        scale: C > 0, the residual size beyond which a residual counts as an outlier.
    """

    kind: str = "linear"
    scale: float = 1.0

    def __post_init__(self) -> None:
        check_choice("RobustLoss", "kind", self.kind, LOSSES)
        scale = self.scale
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (
            math.isfinite(scale) and scale > 0
        ):
            raise ValueError(
                f"RobustLoss({self.kind!r}): the scale (f_scale) must be a finite positive "
                f"number, the residual size that counts as an outlier; got {scale!r}"
            )

    @property
    def is_linear(self) -> bool:
        """Whether this is the plain sum of squares."""
        return self.kind == "linear"

    def cost(self, r: Tensor) -> Tensor:
        """(P,): ``½ C² Σ_i ρ(r_i² / C²)`` of the residuals r (P, R), differentiable."""
        if self.is_linear:
            return 0.5 * (r * r).sum(1)
        c2 = self.scale**2
        return 0.5 * c2 * _rho(self.kind, (r * r) / c2).sum(1)

    def weights(self, r: Tensor) -> Tensor:
        """(P, R): the IRLS weights ``ρ'(r² / C²)`` (the gradient is ``Jᵀ (weights * r)``)."""
        if self.is_linear:
            return torch.ones_like(r)
        return _rho_prime(self.kind, (r * r) / self.scale**2)


def _rho(kind: str, s: Tensor) -> Tensor:
    """ρ(s); the branches not taken are evaluated at safe points (no 0 · inf gradients)."""
    if kind == "huber":
        return torch.where(s <= 1, s, 2 * s.clamp_min(1).sqrt() - 1)
    if kind == "soft_l1":
        return 2 * ((1 + s).sqrt() - 1)
    if kind == "cauchy":
        return torch.log1p(s)
    if kind == "arctan":
        return torch.arctan(s)
    inside = 1 - s.clamp_max(1)  # tukey
    return (1 - inside**3) / 3


def _rho_prime(kind: str, s: Tensor) -> Tensor:
    """ρ'(s)."""
    if kind == "huber":
        return torch.where(s <= 1, torch.ones_like(s), s.clamp_min(1).rsqrt())
    if kind == "soft_l1":
        return (1 + s).rsqrt()
    if kind == "cauchy":
        return 1 / (1 + s)
    if kind == "arctan":
        return 1 / (1 + s * s)
    return (1 - s.clamp_max(1)) ** 2  # tukey
