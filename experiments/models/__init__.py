"""Small models whose global-context module is swappable (Hamburger, attention, none)."""

from experiments.models.backbone import LocalBackbone
from experiments.models.classifier import ContextClassifier
from experiments.models.global_features import ColourHistogram, GridPositionCode
from experiments.models.segmenter import ContextSegmenter
from experiments.models.two_stream import TwoStreamSegmenter, context_channels

__all__ = [
    "ColourHistogram",
    "ContextClassifier",
    "ContextSegmenter",
    "GridPositionCode",
    "LocalBackbone",
    "TwoStreamSegmenter",
    "context_channels",
]
