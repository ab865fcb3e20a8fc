"""``GlobalPoolContext``: the global-average-pooling baseline ("gap" in ``make_context``).

The simplest context a segmenter can get: every pixel receives the same vector, a learned
projection of the image's spatial mean, ``out = z + W mean_{h,w}(z) + b`` (W: a 1x1
convolution, C x C). It carries global information (which classes the image holds) but no
spatial structure, so a Hamburger or attention block that beats it shows that its per-pixel
reconstruction matters, not only the image-level summary (ParseNet's global context, without
its normalisation).
"""

from __future__ import annotations

from torch import Tensor, nn

from implicit_ham._core.validation import check_positive_int


class GlobalPoolContext(nn.Module):
    """z + a projection of the spatial mean of z, broadcast to every pixel.

    Args:
        channels: input / output channels C (the projection has C^2 + C parameters).
    """

    def __init__(self, channels: int) -> None:
        super().__init__()
        check_positive_int(type(self).__name__, "channels", channels)
        self.channels = channels
        self.project = nn.Conv2d(channels, channels, 1)

    def forward(self, z: Tensor) -> Tensor:
        """z (B, C, H, W) or a sequence (B, C, N) -> z + project(mean over the positions of
        z), shaped like z (the flatten rule of the decompositions: every axis after the
        channels is a position)."""
        if z.ndim not in (3, 4) or z.shape[1] != self.channels:
            raise ValueError(
                f"GlobalPoolContext expects (B, {self.channels}, H, W) maps or "
                f"(B, {self.channels}, N) sequences, got {tuple(z.shape)}; feed "
                f"{self.channels} channels or build the context with the input's channel count"
            )
        mean = z.flatten(2).mean(dim=2)[..., None, None]  # (B, C, 1, 1)
        return z + self.project(mean).reshape(*z.shape[:2], *([1] * (z.ndim - 2)))

    def extra_repr(self) -> str:
        return f"channels={self.channels}"
