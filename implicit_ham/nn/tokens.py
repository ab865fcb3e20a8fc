"""The input check shared by the token mixers: tokens (B, N, C), as
``nn.MultiheadAttention(batch_first=True)`` takes them."""

from __future__ import annotations

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
