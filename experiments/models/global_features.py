"""Parameter-free per-cell features for a global-context module: *what* is here and *where*.

A context module can only relate two regions if their features already say what they share and
where each one is, and with the paper's one-step gradient nothing trains the features of pixels
that carry no label (legend_seg's legend strip): the one-step gradient reaches a pixel only
through its own coefficients. These features therefore need no training:

* ``ColourHistogram``: the fraction of each cell's pixels in each of ``bins ** C`` colour bins,
  the same wherever a texture is painted (up to its phase), different between textures;
* ``GridPositionCode``: a one-hot code of the ``grid x grid`` block a cell lies in, so a channel
  is non-zero only inside its block (e.g. only on a legend patch).

Both have receptive fields of one cell, so they add no context of their own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from implicit_ham.plugins import check_positive_int


class ColourHistogram(nn.Module):
    """x (B, C, H, W) in [0, 1] -> (B, bins ** C, h, w): per-cell colour-bin fractions.

    Each channel of ``x`` is cut into ``bins`` equal intervals of [0, 1] (values outside are
    clamped); a pixel's bin is its tuple of intervals; a cell's histogram is the mean one-hot bin
    over the pixels of its block of the ``(h, w)`` grid (adaptive average pooling). Channels sum
    to 1 at every cell.

    Args:
        in_channels: C, channels of ``x`` (3 for RGB: 27 bins with the default ``bins=3``).
        bins: intervals per channel.
    """

    def __init__(self, in_channels: int, bins: int = 3) -> None:
        super().__init__()
        check_positive_int("ColourHistogram", "in_channels", in_channels)
        check_positive_int("ColourHistogram", "bins", bins)
        self.in_channels, self.bins = in_channels, bins

    @property
    def channels(self) -> int:
        """Output channels, ``bins ** in_channels``."""
        return self.bins**self.in_channels

    def forward(self, x: Tensor, size: tuple[int, int]) -> Tensor:
        """x (B, C, H, W) -> (B, bins ** C, *size) float, in x's dtype and device."""
        if x.ndim != 4 or x.shape[1] != self.in_channels:
            raise ValueError(
                f"ColourHistogram expects (B, {self.in_channels}, H, W), got {tuple(x.shape)}; "
                "build it with in_channels equal to the image channels"
            )
        levels = (x.clamp(0, 1) * self.bins).long().clamp_max(self.bins - 1)
        weights = self.bins ** torch.arange(self.in_channels - 1, -1, -1, device=x.device)
        index = (levels * weights.view(1, -1, 1, 1)).sum(1)
        one_hot = F.one_hot(index, self.channels).permute(0, 3, 1, 2).to(x.dtype)
        return F.adaptive_avg_pool2d(one_hot, size)

    def extra_repr(self) -> str:
        return f"in_channels={self.in_channels}, bins={self.bins}, channels={self.channels}"


class GridPositionCode(nn.Module):
    """(B, grid ** 2, h, w): channel ``r * grid + c`` is 1 on the cells of block (r, c), else 0.

    Block (r, c) holds the cells (i, j) with ``floor(i * grid / h) = r`` and
    ``floor(j * grid / w) = c``: the feature map cut into ``grid x grid`` near-equal blocks.

    Args:
        grid: blocks per side.
    """

    def __init__(self, grid: int = 8) -> None:
        super().__init__()
        check_positive_int("GridPositionCode", "grid", grid)
        self.grid = grid

    @property
    def channels(self) -> int:
        """Output channels, ``grid ** 2``."""
        return self.grid**2

    def forward(self, like: Tensor) -> Tensor:
        """like (B, *, h, w) -> (B, grid ** 2, h, w) in like's dtype and device."""
        batch, _, height, width = like.shape
        rows = torch.arange(height, device=like.device) * self.grid // height
        cols = torch.arange(width, device=like.device) * self.grid // width
        block = rows[:, None] * self.grid + cols[None, :]
        code = F.one_hot(block, self.channels).permute(2, 0, 1).to(like.dtype)
        return code.unsqueeze(0).expand(batch, -1, -1, -1)

    def extra_repr(self) -> str:
        return f"grid={self.grid}"
