"""Context modules, all (B, C, H, W) -> (B, C, H, W): the Hamburger block and its baselines,
and ``make_context`` (any of them by name)."""

from implicit_ham.nn.attention import SDPAttention2d, SelfAttention2d
from implicit_ham.nn.context import (
    CONTEXTS,
    context_names,
    make_context,
    register_context,
)
from implicit_ham.nn.hamburger import Hamburger
from implicit_ham.nn.identity import IdentityContext

__all__ = [
    "CONTEXTS",
    "Hamburger",
    "IdentityContext",
    "SDPAttention2d",
    "SelfAttention2d",
    "context_names",
    "make_context",
    "register_context",
]
