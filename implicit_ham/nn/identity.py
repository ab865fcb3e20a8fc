"""``IdentityContext``: the "no context module" baseline."""

from __future__ import annotations

from torch import Tensor, nn


class IdentityContext(nn.Module):
    """Returns its input (B, C, H, W) unchanged; no parameters.

    Args:
        channels: optional C; when given, inputs with another channel count are rejected, so
            the baseline fails like the other context modules on a wiring mistake.
    """

    def __init__(self, channels: int | None = None) -> None:
        super().__init__()
        self.channels = channels

    def forward(self, z: Tensor) -> Tensor:
        """z (B, C, H, W) -> z."""
        if self.channels is not None and (z.ndim != 4 or z.shape[1] != self.channels):
            raise ValueError(
                f"IdentityContext expects (B, {self.channels}, H, W), got {tuple(z.shape)}"
            )
        return z

    def extra_repr(self) -> str:
        return "" if self.channels is None else f"channels={self.channels}"
