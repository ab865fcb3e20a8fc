"""``make_context``: build any context module, (B, C, H, W) -> (B, C, H, W), by name.

Names: every registered decomposition ("nmf", "vq", "cd", "svd", and user plug-ins), built as a
``Hamburger`` block around the ham, plus the baselines "self_attention", "sdpa_attention" and
"none" (``IdentityContext``).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..decompositions.registry import DECOMPOSITIONS, get_decomposition
from ..registry import Registry, parameter_names
from .attention import SDPAttention2d, SelfAttention2d
from .hamburger import Hamburger
from .identity import IdentityContext

BASELINES: Registry[nn.Module] = Registry("context module")
BASELINES.register("self_attention")(SelfAttention2d)
BASELINES.register("sdpa_attention")(SDPAttention2d)
BASELINES.register("none")(IdentityContext)

BLOCK_OPTIONS = ("version", "ham_channels", "lower_relu", "dual", "compile_block")


def context_names() -> list[str]:
    """Every name ``make_context`` accepts, sorted."""
    return sorted({*DECOMPOSITIONS.names(), *BASELINES.names()})


def make_context(name: str, channels: int, **kwargs: Any) -> nn.Module:
    """A context module on ``channels`` channels.

    Args:
        name: a decomposition name (-> ``Hamburger``) or a baseline name (see module docstring).
        channels: C, input and output channels.
        **kwargs: for a decomposition, the ``Hamburger`` options ``version``, ``ham_channels``,
            ``lower_relu``, ``dual`` (v2+: add a channel ham with ``spatial=False``) and
            ``compile_block`` (``nn.Module.compile()`` on the whole block: one graph, no breaks
            under OneStep / Unroll / Phantom; state-dict keys unchanged) plus the
            decomposition's own options (``rank``, ``steps``, ``adjoint``, ...); for a baseline,
            its constructor options. Unknown names or options raise errors listing the choices.
    """
    if name in BASELINES.names():
        return BASELINES.make(name, channels=channels, **kwargs)
    if name not in DECOMPOSITIONS.names():
        raise KeyError(f"unknown context {name!r}; valid choices: {', '.join(context_names())}")
    block = {key: kwargs.pop(key) for key in BLOCK_OPTIONS if key in kwargs}
    dual = bool(block.pop("dual", False))
    compile_block = bool(block.pop("compile_block", False))
    unknown = sorted(set(kwargs) - set(parameter_names(DECOMPOSITIONS.get(name))))
    if unknown or {"channels", "spatial"} & set(kwargs):
        bad = unknown or sorted({"channels", "spatial"} & set(kwargs))
        raise TypeError(
            f"make_context({name!r}): option(s) {', '.join(bad)} not accepted; valid: "
            f"{', '.join(BLOCK_OPTIONS)} and the decomposition's options except channels and "
            "spatial (set by the block)"
        )
    width = block.get("ham_channels") or channels
    ham = get_decomposition(name, channels=width, **kwargs)
    channel_ham = get_decomposition(name, channels=width, spatial=False, **kwargs) if dual else None
    module = Hamburger(channels, ham, channel_ham=channel_ham, **block)
    if compile_block:
        module.compile()
    return module
