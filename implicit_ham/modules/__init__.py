"""Context modules, all (B, C, H, W) -> (B, C, H, W): the Hamburger block and its baselines."""

from implicit_ham.modules.attention import SDPAttention2d, SelfAttention2d
from implicit_ham.modules.context import BASELINES, context_names, make_context
from implicit_ham.modules.hamburger import Hamburger
from implicit_ham.modules.identity import IdentityContext

__all__ = [
    "BASELINES",
    "Hamburger",
    "IdentityContext",
    "SDPAttention2d",
    "SelfAttention2d",
    "context_names",
    "make_context",
]
