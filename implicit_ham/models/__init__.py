"""Small models whose global-context module is swappable (Hamburger, attention, none)."""

from .backbone import LocalBackbone
from .classifier import ContextClassifier
from .segmenter import ContextSegmenter

__all__ = ["ContextClassifier", "ContextSegmenter", "LocalBackbone"]
