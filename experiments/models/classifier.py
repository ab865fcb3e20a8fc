"""Image classification: local backbone -> global-context module -> pooled linear classifier."""

from __future__ import annotations

from torch import Tensor, nn

from experiments.models.backbone import LocalBackbone


class ContextClassifier(nn.Module):
    """(B, in_channels, H, W) -> logits (B, num_classes).

    Args:
        in_channels: image channels. num_classes: classes.
        context: a (B, width, h, w) -> (B, width, h, w) module.
        width: backbone channels; must equal the context module's channels.
    """

    def __init__(
        self, in_channels: int, num_classes: int, context: nn.Module, width: int = 32
    ) -> None:
        super().__init__()
        self.backbone = LocalBackbone(in_channels, width)
        self.context = context
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(width, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, in_channels, H, W) -> (B, num_classes) logits."""
        features = self.context(self.backbone(x))
        return self.classifier(self.pool(features).flatten(1))
