"""A convolutional backbone with a small, known receptive field.

It sees only a local neighbourhood (17 x 17 input pixels with the defaults), so any decision
that needs information from farther away must come from the context module placed after it.
"""

from __future__ import annotations

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

    def __init__(self, in_channels: int, width: int = 32) -> None:
        super().__init__()
        self.in_channels, self.width = in_channels, width
        self.layers = nn.Sequential(
            _conv_bn_relu(in_channels, width // 2, 1),
            _conv_bn_relu(width // 2, width, 2),
            _conv_bn_relu(width, width, 2),
            _conv_bn_relu(width, width, 1),
        )

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, in_channels, H, W) -> (B, width, ceil(H/4), ceil(W/4))."""
        return self.layers(x)

    def extra_repr(self) -> str:
        return f"in_channels={self.in_channels}, width={self.width}, rf={self.receptive_field}"
