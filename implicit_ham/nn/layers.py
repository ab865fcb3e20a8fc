"""Injectable normalisation and activation layers, timm style.

A *norm layer* is a callable ``norm_layer(num_features) -> nn.Module`` (``nn.BatchNorm2d`` is
one as it is; for GroupNorm, whose first argument is the group count, use ``group_norm(32)``).
An *activation layer* is a callable ``act_layer() -> nn.Module`` (``nn.ReLU``, ``nn.GELU``, a
``functools.partial``). The blocks call them once per place they are used, so every place gets
its own module (and its own parameters, for a norm).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from implicit_ham._core.validation import check_positive_int

NormLayer = Callable[[int], nn.Module]
ActLayer = Callable[[], nn.Module]


class GroupNormLayer:
    """``GroupNormLayer(groups)(channels)`` -> ``nn.GroupNorm(groups, channels)``: a GroupNorm
    with a fixed group count as a timm-style norm layer (picklable, comparable, readable)."""

    def __init__(self, groups: int = 32, eps: float = 1e-5) -> None:
        check_positive_int("group_norm", "groups", groups)
        self.groups, self.eps = groups, eps

    def __call__(self, channels: int) -> nn.GroupNorm:
        if channels % self.groups:
            raise ValueError(
                f"GroupNorm({self.groups}) cannot normalise {channels} channels: the group "
                f"count must divide the channel count; choose channels divisible by "
                f"{self.groups} or another group count (group_norm(groups=...))."
            )
        return nn.GroupNorm(self.groups, channels, eps=self.eps)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GroupNormLayer) and (self.groups, self.eps) == (
            other.groups,
            other.eps,
        )

    def __hash__(self) -> int:
        return hash((GroupNormLayer, self.groups, self.eps))

    def __repr__(self) -> str:
        return f"group_norm({self.groups})"


def group_norm(groups: int = 32, eps: float = 1e-5) -> GroupNormLayer:
    """The norm layer ``channels -> nn.GroupNorm(groups, channels, eps)``; mmcv's
    ``dict(type="GN", num_groups=groups)``. Building it on a channel count that ``groups`` does
    not divide raises a ValueError that says so."""
    return GroupNormLayer(groups, eps)


def relu() -> nn.Module:
    """The default activation: ``nn.ReLU(inplace=True)`` (mmcv's ConvModule default; in place
    on the fresh output of the layer before it, so no second map is allocated)."""
    return nn.ReLU(inplace=True)


def build_norm(norm_layer: NormLayer, channels: int, owner: str, where: str) -> nn.Module:
    """``norm_layer(channels)``, with a construction error re-raised naming the block and the
    place (``where``) it was for."""
    if not callable(norm_layer):
        raise TypeError(
            f"{owner}: norm_layer must be a callable channels -> nn.Module (e.g. "
            f"nn.BatchNorm2d or ih.nn.group_norm(32)), got {type(norm_layer).__name__}"
        )
    try:
        return norm_layer(channels)
    except ValueError as error:
        raise ValueError(f"{owner}: the {where} norm on {channels} channels: {error}") from error


def build_act(act_layer: ActLayer, owner: str) -> nn.Module:
    """``act_layer()``, checked to be a module."""
    message = (
        f"{owner}: act_layer must be a callable () -> nn.Module (e.g. nn.ReLU, nn.GELU; not a "
        f"function such as torch.relu), got {act_layer!r}"
    )
    try:
        module = act_layer() if callable(act_layer) else None
    except TypeError as error:
        raise TypeError(message) from error
    if not isinstance(module, nn.Module):
        raise TypeError(message)
    return module
