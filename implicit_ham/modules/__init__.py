"""Context modules, all (B, C, H, W) -> (B, C, H, W): the Hamburger block and its baselines."""

from .attention import SDPAttention2d, SelfAttention2d
from .context import BASELINES, context_names, make_context
from .hamburger import Hamburger
from .identity import IdentityContext

__all__ = [
    "BASELINES",
    "Hamburger",
    "IdentityContext",
    "SDPAttention2d",
    "SelfAttention2d",
    "context_names",
    "make_context",
]
