"""``make_context``: build any context module, (B, C, H, W) -> (B, C, H, W), by name.

Names: every registered decomposition ("nmf", "vq", "cd", "svd", and user plug-ins), built as a
``Hamburger`` block around the ham, plus the baselines "self_attention", "sdpa_attention" and
"none" (``IdentityContext``) and "gap" (``GlobalPoolContext``: z + a projection of the
spatial mean).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from implicit_ham._core.registry import Registry, parameter_names
from implicit_ham.decompositions.registry import DECOMPOSITIONS, make_decomposition
from implicit_ham.nn.attention import SDPAttention2d, SelfAttention2d
from implicit_ham.nn.global_pool import GlobalPoolContext
from implicit_ham.nn.hamburger import Hamburger
from implicit_ham.nn.identity import IdentityContext

CONTEXTS: Registry[nn.Module] = Registry("context module")
register_context = CONTEXTS.register_function("register_context", __name__)
CONTEXTS.register("self_attention")(SelfAttention2d)
CONTEXTS.register("sdpa_attention")(SDPAttention2d)
CONTEXTS.register("none")(IdentityContext)
CONTEXTS.register("gap")(GlobalPoolContext)

BLOCK_OPTIONS = ("version", "ham_channels", "lower_relu", "norm_layer", "act_layer")


def context_names() -> list[str]:
    """Every name ``make_context`` accepts, sorted."""
    return sorted({*DECOMPOSITIONS.names(), *CONTEXTS.names()})


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
            (``rank``, ``steps``, ``adjoint``, ``eval_init``, ...); for a baseline, its
            constructor options. Unknown names or options raise errors listing the choices.
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
    if name not in DECOMPOSITIONS.names():
        raise KeyError(f"unknown context {name!r}; valid choices: {', '.join(context_names())}")
    block = {key: kwargs.pop(key) for key in BLOCK_OPTIONS if key in kwargs}
    unknown = sorted(set(kwargs) - set(parameter_names(DECOMPOSITIONS.get(name))))
    if unknown or {"channels", "spatial"} & set(kwargs):
        bad = unknown or sorted({"channels", "spatial"} & set(kwargs))
        raise TypeError(
            f"make_context({name!r}): option(s) {', '.join(bad)} not accepted; valid: "
            f"dual, compile_block, {', '.join(BLOCK_OPTIONS)} and the decomposition's options "
            "except channels and spatial (set by the block)"
        )
    width = block.get("ham_channels") or channels
    ham = make_decomposition(name, channels=width, **kwargs)
    channel_ham = (
        make_decomposition(name, channels=width, spatial=False, **kwargs) if dual else None
    )
    return Hamburger(channels, ham, channel_ham=channel_ham, **block)
