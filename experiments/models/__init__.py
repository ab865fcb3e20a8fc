"""Small models whose global-context module is swappable (Hamburger, attention, none)."""

from .backbone import LocalBackbone
from .classifier import ContextClassifier
from .global_features import ColourHistogram, GridPositionCode
from .segmenter import ContextSegmenter
from .two_stream import TwoStreamSegmenter, context_channels

__all__ = [
    "ColourHistogram",
    "ContextClassifier",
    "ContextSegmenter",
    "GridPositionCode",
    "LocalBackbone",
    "TwoStreamSegmenter",
    "context_channels",
]
