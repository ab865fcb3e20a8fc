"""The input checks shared by the context modules: tokens (B, N, C), as
``nn.MultiheadAttention(batch_first=True)`` takes them, for the token mixers; an input on the
module's device and in its dtype (outside autocast), for every module with a first layer."""

from __future__ import annotations

import torch
from torch import Tensor


def check_tokens(owner: str, x: Tensor, channels: int) -> None:
    """Raise ValueError unless x is tokens (B, N, channels); the message names the shape and
    the fix (a (B, C, H, W) map is refused: it is not a sequence of tokens)."""
    if x.ndim == 3 and x.shape[-1] == channels:
        return
    if x.ndim == 4:
        fix = (
            "a token mixer takes a sequence, not a feature map; flatten the map to tokens with "
            "x.flatten(2).transpose(1, 2), or use a map context (ih.make_context('nmf', C), "
            "ih.SDPAttention2d)"
        )
    elif x.ndim == 3:
        fix = (
            f"the last axis must hold the {channels} channels (tokens (B, N, C), batch first); "
            "a (B, C, N) sequence is x.transpose(1, 2)"
        )
    else:
        fix = "reshape the input to (batch, tokens, channels)"
    raise ValueError(
        f"{owner} expects tokens (B, N, {channels}), got shape {tuple(x.shape)}; {fix}."
    )


def check_device_and_dtype(owner: str, x: Tensor, weight: Tensor) -> None:
    """ValueError / TypeError naming the fix, before the module's first layer, when x is not
    on ``weight``'s device or (outside autocast) not in its dtype (O(1))."""
    if x.device != weight.device:
        raise ValueError(
            f"{owner}: the input is on {x.device} but the module's parameters are on "
            f"{weight.device}; move one of them (module.to(x.device))."
        )
    if not x.is_floating_point():
        raise TypeError(
            f"{owner}: the input is {x.dtype}; a floating input is needed (x.to({weight.dtype}))."
        )
    if x.dtype != weight.dtype and not torch.is_autocast_enabled(x.device.type):
        raise TypeError(
            f"{owner}: the input is {x.dtype} but the module's parameters are "
            f"{weight.dtype}; convert the input (x.to({weight.dtype})) or the module "
            f"(module.to({x.dtype})), or run under torch.autocast."
        )
