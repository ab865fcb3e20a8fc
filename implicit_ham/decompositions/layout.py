"""The channel layout of a decomposition layer: how its input x, a feature map (B, C, H, W) or
a sequence (B, C, N), becomes the matrices X (B*S, d, n) it decomposes and back. The one
flatten rule: every axis after the channels is a position, n = H*W for a map and n = N for a
sequence (so a sequence is the map (B, C, N, 1), with identical output). ``spatial=True``:
d = C/S channels, n positions; ``spatial=False`` (the channel ham): the roles are swapped,
d = n positions and n = C/S. The output keeps the input's memory format
(``match_memory_format``), and ``check_bound_channels`` checks the channels a block hands over.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from implicit_ham._core.validation import check_positive_int
from implicit_ham.decompositions.input_checks import check_groups


def check_bound_channels(owner: str, channels: int, *, built_for: int | None, groups: int) -> None:
    """ValueError unless ``channels`` (C, handed to ``Decomposition.bind_channels``) is a
    positive int, equals ``built_for`` (the layer's channels, when set) and is divisible by
    ``groups`` (S)."""
    check_positive_int(owner, "channels", channels)
    if built_for is not None and built_for != channels:
        raise ValueError(
            f"{owner} was built for channels={built_for} but receives {channels} "
            "channels; make them equal (or leave the layer's channels unset)."
        )
    check_groups(owner, channels, groups)


def flatten(owner: str, x: Tensor, *, groups: int, spatial: bool, channels: int | None) -> Tensor:
    """(B, C, H, W) or (B, C, N) -> X (B*S, d, n) with S = ``groups``, n = H*W or N.

    Raises:
        ValueError: x is neither 3-D nor 4-D, C is not divisible by S, or ``channels`` is set
            and differs from C.
    """
    if x.ndim not in (3, 4):
        raise ValueError(
            f"{owner} expects a feature map (B, C, H, W) or a sequence "
            f"(B, C, N), got shape {tuple(x.shape)}; reshape the input to one of them "
            "(tokens (B, N, C) are x.transpose(1, 2))."
        )
    batch, width = x.shape[:2]
    positions = math.prod(x.shape[2:])
    check_groups(owner, width, groups)
    if channels is not None and width != channels:
        raise ValueError(
            f"{owner} was built for channels={channels}, got an input "
            f"with {width}; pass matching channels (or channels=None with init='random')."
        )
    grouped = x.reshape(batch * groups, width // groups, positions)
    return grouped if spatial else grouped.transpose(1, 2)


def unflatten(y: Tensor, shape: torch.Size | tuple[int, ...], *, spatial: bool) -> Tensor:
    """Inverse of ``flatten``: Y (B*S, d, n) -> ``shape`` (B, C, H, W) or (B, C, N)."""
    return (y if spatial else y.transpose(1, 2)).reshape(shape)


def match_memory_format(y: Tensor, x: Tensor) -> Tensor:
    """``y`` in ``x``'s memory format (channels_last in, channels_last out; a sequence has
    only the default format)."""
    if x.ndim != 4 or x.is_contiguous() or not x.is_contiguous(memory_format=torch.channels_last):
        return y
    return y.contiguous(memory_format=torch.channels_last)
