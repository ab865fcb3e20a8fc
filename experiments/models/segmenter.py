"""Semantic segmentation: local backbone -> global-context module -> per-pixel classifier."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch.nn.functional as F
from torch import Tensor, nn

from experiments.models.backbone import LocalBackbone

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is Python >= 3.11; the project supports 3.10


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
        self.backbone_frozen = False
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

    def freeze_backbone(self) -> None:
        """Train only the context module and the classifier: the backbone's parameters stop
        requiring gradient and its BatchNorm layers stay in eval mode (fixed statistics), as a
        frozen pretrained backbone."""
        self.backbone.requires_grad_(False)
        self.backbone_frozen = True
        self.backbone.eval()

    def train(self, mode: bool = True) -> Self:
        """``nn.Module.train``, except that a frozen backbone stays in eval mode."""
        super().train(mode)
        if self.backbone_frozen:
            self.backbone.eval()
        return self
