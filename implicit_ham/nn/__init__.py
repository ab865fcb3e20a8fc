"""Context modules, all (B, C, H, W) -> (B, C, H, W): the Hamburger block and its baselines,
and ``make_context`` (any of them by name); SegNeXt's decode head ``LightHamHead``; the
injectable norm / activation helpers (``group_norm``)."""

from implicit_ham.nn.attention import SDPAttention2d, SelfAttention2d
from implicit_ham.nn.context import (
    CONTEXTS,
    context_names,
    make_context,
    register_context,
)
from implicit_ham.nn.dropout import VariationalDropout, VariationalDropout2d
from implicit_ham.nn.global_pool import GlobalPoolContext
from implicit_ham.nn.hamburger import Hamburger
from implicit_ham.nn.identity import IdentityContext
from implicit_ham.nn.layers import group_norm
from implicit_ham.nn.light_ham_head import LightHamHead, mmseg_state_dict, segnext_nmf
from implicit_ham.nn.normalization import NORM_KINDS, apply_norm, remove_norm

__all__ = [
    "CONTEXTS",
    "NORM_KINDS",
    "GlobalPoolContext",
    "Hamburger",
    "IdentityContext",
    "LightHamHead",
    "SDPAttention2d",
    "SelfAttention2d",
    "VariationalDropout",
    "VariationalDropout2d",
    "apply_norm",
    "context_names",
    "group_norm",
    "make_context",
    "mmseg_state_dict",
    "register_context",
    "remove_norm",
    "segnext_nmf",
]
