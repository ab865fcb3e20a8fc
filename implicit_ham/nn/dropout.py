"""Variational dropout for fixed-point maps: one mask per solve, the same at every iteration.

Plain dropout inside ``f`` draws a new mask at every evaluation, so the iteration has no fixed
point. ``VariationalDropout`` draws its mask at its first call inside an ``ih.fixed_point``
solve and reuses it for every later call of the same solve (``implicit_ham._core.solve_scope``);
the next solve draws a new one. Outside a solve each call draws its own mask (plain dropout).
The mask is scaled by ``1 / (1 - p)``, so the expected output equals the input; in eval mode the
module is the identity.

A second derivative (``create_graph=True`` through an at-fixed-point mode) re-evaluates ``f``
after the solve and would draw another mask: train with ``p > 0`` under first-order gradients.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from implicit_ham._core.solve_scope import current_solve


class VariationalDropout(nn.Module):
    """Dropout with one mask per solve, of the input's full shape (B, ...).

    Args:
        p: drop probability in [0, 1).
    """

    mask_dims: tuple[int, ...] = ()  # the dimensions the mask is shared over (none)

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
            raise ValueError(f"{type(self).__name__}: p must be in [0, 1), got {p!r}")
        self.p = float(p)
        self._token: object | None = None
        self._mask: Tensor | None = None

    def extra_repr(self) -> str:
        return f"p={self.p}"

    def forward(self, x: Tensor) -> Tensor:
        """x (B, ...) -> x * mask (same shape); the identity in eval mode or for p = 0."""
        if not self.training or self.p == 0.0:
            return x
        if torch.compiler.is_compiling():
            raise NotImplementedError(
                f"{type(self).__name__} does not train under torch.compile (its mask is held "
                "per solve in Python state); compile the model in eval mode or use p=0"
            )
        token = current_solve()
        mask = self._mask
        if token is None or token is not self._token or mask is None or not self._fits(mask, x):
            mask = self._draw(x)
            self._token, self._mask = token, mask
        return x * mask

    def _shape(self, x: Tensor) -> list[int]:
        shape = list(x.shape)
        for dim in self.mask_dims:
            shape[dim] = 1
        return shape

    def _fits(self, mask: Tensor, x: Tensor) -> bool:
        return list(mask.shape) == self._shape(x) and mask.dtype == x.dtype

    def _draw(self, x: Tensor) -> Tensor:
        keep = torch.full(self._shape(x), 1.0 - self.p, dtype=x.dtype, device=x.device)
        return torch.bernoulli(keep) / (1.0 - self.p)


class VariationalDropout2d(VariationalDropout):
    """Channel-wise variational dropout for (B, C, H, W) maps: one (B, C, 1, 1) mask per solve
    (whole feature maps are dropped, as ``nn.Dropout2d`` does)."""

    mask_dims = (2, 3)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, C, H, W) -> x * mask (same shape)."""
        if x.ndim != 4:
            raise ValueError(
                f"VariationalDropout2d expects (B, C, H, W) inputs, got shape {tuple(x.shape)}"
            )
        return super().forward(x)
