"""``make_context``: build any context module by name.

Map contexts, (B, C, H, W) -> (B, C, H, W): every registered decomposition ("nmf", "vq", "cd",
"svd", and user plug-ins), built as a ``Hamburger`` block around the ham, plus the baselines
"self_attention", "sdpa_attention", "none" (``IdentityContext``) and "gap"
(``GlobalPoolContext``: z + a projection of the spatial mean).

Token mixers, tokens (B, N, C) -> the mixing term (B, N, C) of a pre-norm transformer block:
"<decomposition>_mixer" for every registered decomposition ("nmf_mixer", "vq_mixer", ...),
built as a ``HamMixer`` around the ham, plus the baselines "sdpa_mixer" (``SDPAMixer``) and
"linear_attention_mixer" (``LinearAttentionMixer``). All of them are bidirectional, but
"sdpa_mixer" with ``causal=True`` (a causal mask).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from implicit_ham._core.registry import Registry, parameter_names
from implicit_ham.decompositions.registry import DECOMPOSITIONS, make_decomposition
from implicit_ham.nn.attention import SDPAttention2d, SelfAttention2d
from implicit_ham.nn.attention_mixers import LinearAttentionMixer, SDPAMixer
from implicit_ham.nn.global_pool import GlobalPoolContext
from implicit_ham.nn.ham_mixer import HamMixer
from implicit_ham.nn.hamburger import Hamburger
from implicit_ham.nn.identity import IdentityContext

CONTEXTS: Registry[nn.Module] = Registry("context module")
register_context = CONTEXTS.register_function("register_context", __name__)
CONTEXTS.register("self_attention")(SelfAttention2d)
CONTEXTS.register("sdpa_attention")(SDPAttention2d)
CONTEXTS.register("none")(IdentityContext)
CONTEXTS.register("gap")(GlobalPoolContext)
CONTEXTS.register("sdpa_mixer")(SDPAMixer)
CONTEXTS.register("linear_attention_mixer")(LinearAttentionMixer)

BLOCK_OPTIONS = ("version", "ham_channels", "lower_relu", "norm_layer", "act_layer")
MIXER_OPTIONS = ("ham_channels", "lower_relu", "bias")
MIXER_SUFFIX = "_mixer"


def context_names() -> list[str]:
    """Every name ``make_context`` accepts, sorted."""
    mixers = [f"{name}{MIXER_SUFFIX}" for name in DECOMPOSITIONS.names()]
    return sorted({*DECOMPOSITIONS.names(), *mixers, *CONTEXTS.names()})


def decomposition_of(name: str) -> str | None:
    """The decomposition a context name builds a module around ("nmf" -> "nmf" for the
    ``Hamburger``, "nmf_mixer" -> "nmf" for the ``HamMixer``), or None for a baseline (whose
    module takes no solver and no backward mode)."""
    if name in CONTEXTS.names():
        return None
    if name in DECOMPOSITIONS.names():
        return name
    stem = name.removesuffix(MIXER_SUFFIX)
    return stem if stem != name and stem in DECOMPOSITIONS.names() else None


def make_context(
    name: str, channels: int, *, dual: bool = False, compile_block: bool = False, **kwargs: Any
) -> nn.Module:
    """A context module on ``channels`` channels.

    Args:
        name: a decomposition name (-> ``Hamburger``) or a baseline name (see module docstring).
        channels: C, input and output channels.
        dual: decompositions only (v2+): add a channel ham (the same decomposition with
            ``spatial=False``) beside the spatial one.
        compile_block: ``nn.Module.compile()`` on the whole module (in place: state-dict keys
            unchanged); a Hamburger block under OneStep / Unroll / Phantom traces as one graph.
        **kwargs: for a decomposition, the ``Hamburger`` options ``version``, ``ham_channels``,
            ``lower_relu``, ``norm_layer`` and ``act_layer`` plus the decomposition's own options
            (``rank``, ``steps``, ``adjoint``, ``eval_init``, ...); for a "<decomposition>_mixer"
            the ``HamMixer`` options ``ham_channels``, ``lower_relu`` and ``bias`` plus the
            decomposition's; for a baseline, its constructor options. Unknown names or options
            raise errors listing the choices.
    """
    module = _build_context(name, channels, dual, kwargs)
    if compile_block:
        module.compile()
    return module


def _build_context(name: str, channels: int, dual: bool, kwargs: dict[str, Any]) -> nn.Module:
    if name in CONTEXTS.names():
        if dual:
            raise TypeError(f"make_context({name!r}): dual applies to decompositions only")
        return CONTEXTS.make(name, channels=channels, **kwargs)
    decomposition = decomposition_of(name)
    if decomposition is None:
        raise KeyError(f"unknown context {name!r}; valid choices: {', '.join(context_names())}")
    mixer = decomposition != name
    if mixer and dual:
        raise TypeError(f"make_context({name!r}): dual applies to Hamburger blocks only")
    options = MIXER_OPTIONS if mixer else BLOCK_OPTIONS
    block = {key: kwargs.pop(key) for key in options if key in kwargs}
    unknown = sorted(set(kwargs) - set(parameter_names(DECOMPOSITIONS.get(decomposition))))
    if unknown or {"channels", "spatial"} & set(kwargs):
        bad = unknown or sorted({"channels", "spatial"} & set(kwargs))
        raise TypeError(
            f"make_context({name!r}): option(s) {', '.join(bad)} not accepted; valid: "
            f"{'' if mixer else 'dual, '}compile_block, {', '.join(options)} and the "
            "decomposition's options except channels and spatial (set by the block)"
        )
    width = block.get("ham_channels") or channels
    ham = make_decomposition(decomposition, channels=width, **kwargs)
    if mixer:
        return HamMixer(channels, ham, **block)
    channel_ham = (
        make_decomposition(decomposition, channels=width, spatial=False, **kwargs) if dual else None
    )
    return Hamburger(channels, ham, channel_ham=channel_ham, **block)
