"""The digit classifier behind the offline generation metrics (FID, KID, precision / recall in
its features; the consistency score from its class probabilities).

It reads one half of a twin-digit canvas, (B, 1, 32, 16), and returns class logits; its
penultimate layer (``features``, 64 ReLU units) is the feature space of the metrics, the way
Inception's pool layer is for ImageNet FID. A canvas's feature vector is the concatenation of
its two halves' features (128 dimensions).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from experiments.data.digits import NUM_CLASSES
from experiments.data.twin_digits import halves

FEATURES = 64
DROPOUT = 0.3


def _conv(c_in: int, c_out: int) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU()]


class HalfDigitClassifier(nn.Module):
    """(B, 1, 32, 16) in [0, 1] -> logits (B, 10); ``features`` -> (B, 64).

    Three conv3x3-BN-ReLU layers (two 2x2 max pools), dropout, a 64-unit ReLU layer (the
    features), dropout, the linear classifier. Use it in eval mode for features.
    """

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            *_conv(1, 32),
            nn.MaxPool2d(2),  # 16 x 8
            *_conv(32, 64),
            nn.MaxPool2d(2),  # 8 x 4
            *_conv(64, 64),
            nn.Flatten(),
            nn.Dropout(DROPOUT),
            nn.Linear(64 * 8 * 4, FEATURES),
            nn.ReLU(),
        )
        self.dropout = nn.Dropout(DROPOUT)
        self.classifier = nn.Linear(FEATURES, NUM_CLASSES)

    def features(self, x: Tensor) -> Tensor:
        """Half canvases (B, 1, 32, 16) -> penultimate features (B, 64)."""
        if x.ndim != 4 or x.shape[1:] != (1, 32, 16):
            raise ValueError(f"HalfDigitClassifier expects (B, 1, 32, 16), got {tuple(x.shape)}")
        return self.body(x)

    def forward(self, x: Tensor) -> Tensor:
        """Half canvases (B, 1, 32, 16) -> logits (B, 10)."""
        return self.classifier(self.dropout(self.features(x)))


class CanvasFeatures(nn.Module):
    """Canvases (B, 1, 32, 32) in [0, 1] -> the two halves' features side by side (B, 128).

    ``num_features`` is read by torchmetrics' FID / KID when this module is their feature
    extractor.
    """

    def __init__(self, classifier: HalfDigitClassifier) -> None:
        super().__init__()
        self.classifier = classifier
        self.num_features = 2 * FEATURES

    @torch.no_grad()
    def forward(self, canvases: Tensor) -> Tensor:
        """(B, 1, 32, 32) -> (B, 128) float64-safe features (float32)."""
        left, right = halves(canvases)
        return torch.cat([self.classifier.features(left), self.classifier.features(right)], 1)
