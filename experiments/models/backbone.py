"""A convolutional backbone with a small, known receptive field.

It sees only a local neighbourhood (17 x 17 input pixels with the defaults), so any decision
that needs information from farther away must come from the context module placed after it.
Two coordinate channels (x and y in [-1, 1]) are appended to the input by default: convolutions
are translation-equivariant, so without them a global context module could tell *what* is far
away but not *where* it is (legend_seg's classes are legend positions).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def _conv_bn_relu(cin: int, cout: int, stride: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    )


class LocalBackbone(nn.Module):
    """(B, in_channels, H, W) -> (B, width, H / 4, W / 4) with four 3x3 convolutions.

    Receptive field: 17 x 17 input pixels (strides 1, 2, 2, 1).
    """

    receptive_field = 17

    def __init__(self, in_channels: int, width: int = 32, coords: bool = True) -> None:
        super().__init__()
        self.in_channels, self.width, self.coords = in_channels, width, coords
        self.layers = nn.Sequential(
            _conv_bn_relu(in_channels + 2 * coords, width // 2, 1),
            _conv_bn_relu(width // 2, width, 2),
            _conv_bn_relu(width, width, 2),
            _conv_bn_relu(width, width, 1),
        )

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, in_channels, H, W) -> (B, width, ceil(H/4), ceil(W/4))."""
        if self.coords:
            x = torch.cat([x, coordinate_channels(x)], dim=1)
        return self.layers(x)

    def extra_repr(self) -> str:
        return (
            f"in_channels={self.in_channels}, width={self.width}, coords={self.coords}, "
            f"rf={self.receptive_field}"
        )


def coordinate_channels(x: Tensor) -> Tensor:
    """(B, 2, H, W): the x and y coordinate of every pixel of ``x`` (B, C, H, W), in [-1, 1]."""
    batch, _, height, width = x.shape
    ys = torch.linspace(-1, 1, height, device=x.device, dtype=x.dtype)
    xs = torch.linspace(-1, 1, width, device=x.device, dtype=x.dtype)
    grid = torch.stack(torch.meshgrid(xs, ys, indexing="xy"))
    return grid.unsqueeze(0).expand(batch, -1, -1, -1)
