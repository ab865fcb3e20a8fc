"""Semantic segmentation: local backbone -> global-context module -> per-pixel classifier."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from .backbone import LocalBackbone


class ContextSegmenter(nn.Module):
    """(B, in_channels, H, W) -> logits (B, num_classes, H, W).

    The classifier is per-pixel (1x1 convolutions with one hidden layer), so it adds no spatial
    context of its own.

    Args:
        in_channels: image channels. num_classes: output classes (background included).
        context: a (B, width, h, w) -> (B, width, h, w) module (Hamburger, attention, identity).
        width: backbone channels; must equal the context module's channels.
    """

    def __init__(
        self, in_channels: int, num_classes: int, context: nn.Module, width: int = 32
    ) -> None:
        super().__init__()
        self.backbone = LocalBackbone(in_channels, width)
        self.context = context
        self.classifier = nn.Sequential(
            nn.Conv2d(width, width, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, num_classes, 1),
        )

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, in_channels, H, W) -> (B, num_classes, H, W) logits."""
        features = self.context(self.backbone(x))
        logits = self.classifier(features)
        return F.interpolate(logits, size=x.shape[-2:], mode="bilinear", align_corners=False)
