"""Context modules, (B, C, H, W) -> (B, C, H, W): the Hamburger block and its baselines;
token mixers, (B, N, C) -> (B, N, C): ``HamMixer`` and its attention baselines; and
``make_context`` (any of them by name); SegNeXt's decode head ``LightHamHead``; the
injectable norm / activation helpers (``group_norm``)."""

from implicit_ham.nn.attention import SDPAttention2d, SelfAttention2d
from implicit_ham.nn.attention_mixers import LinearAttentionMixer, SDPAMixer, linear_attention
from implicit_ham.nn.context import (
    CONTEXTS,
    context_names,
    decomposition_of,
    make_context,
    register_context,
)
from implicit_ham.nn.dropout import VariationalDropout, VariationalDropout2d
from implicit_ham.nn.global_pool import GlobalPoolContext
from implicit_ham.nn.ham_mixer import HamMixer
from implicit_ham.nn.hamburger import Hamburger
from implicit_ham.nn.identity import IdentityContext
from implicit_ham.nn.layers import group_norm
from implicit_ham.nn.light_ham_head import LightHamHead, mmseg_state_dict, segnext_nmf
from implicit_ham.nn.normalization import NORM_KINDS, apply_norm, remove_norm

__all__ = [
    "CONTEXTS",
    "NORM_KINDS",
    "GlobalPoolContext",
    "HamMixer",
    "Hamburger",
    "IdentityContext",
    "LightHamHead",
    "LinearAttentionMixer",
    "SDPAMixer",
    "SDPAttention2d",
    "SelfAttention2d",
    "VariationalDropout",
    "VariationalDropout2d",
    "apply_norm",
    "context_names",
    "decomposition_of",
    "group_norm",
    "linear_attention",
    "make_context",
    "mmseg_state_dict",
    "register_context",
    "remove_norm",
    "segnext_nmf",
]
