"""Attention context modules, the baselines Hamburger is compared with.

Both share one parametrisation (1x1 convs for queries, keys, values and the output) and one
formula, ``out = z + W_o softmax(Q^T K / sqrt(d_h)) V`` per head over the N = H*W pixels:
``SelfAttention2d`` materialises the N x N attention matrix (the paper's "SA", non-local block),
``SDPAttention2d`` calls ``torch.nn.functional.scaled_dot_product_attention`` (a fused kernel
where the backend has one). With equal weights they compute the same function.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from implicit_ham._core.validation import check_positive_int


def attention_width(owner: str, channels: int, inner_channels: int | None, heads: int) -> int:
    """The attention's inner width (``channels`` when None), after checking that the widths
    and ``heads`` are positive integers and that ``heads`` divides the inner width."""
    inner = channels if inner_channels is None else inner_channels
    check_positive_int(owner, "channels", channels)
    check_positive_int(owner, "inner_channels", inner)
    check_positive_int(owner, "heads", heads)
    if inner % heads:
        raise ValueError(
            f"{owner}: inner_channels={inner} is not divisible by heads={heads}; "
            "choose heads that divide it."
        )
    return inner


class _Attention2d(nn.Module, ABC):
    """Shared projections; subclasses define ``attend`` on (B, heads, N, d_h) tensors."""

    def __init__(self, channels: int, inner_channels: int | None = None, heads: int = 1) -> None:
        super().__init__()
        inner = attention_width(type(self).__name__, channels, inner_channels, heads)
        self.channels, self.inner_channels, self.heads = channels, inner, heads
        self.query = nn.Conv2d(channels, inner, 1)
        self.key = nn.Conv2d(channels, inner, 1)
        self.value = nn.Conv2d(channels, inner, 1)
        self.out = nn.Conv2d(inner, channels, 1)

    @abstractmethod
    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """(B, heads, N, d_h) x3 -> (B, heads, N, d_h): softmax(q k^T / sqrt(d_h)) v."""

    def forward(self, z: Tensor) -> Tensor:
        """z (B, channels, H, W) -> z + attention output, (B, channels, H, W)."""
        if z.ndim != 4 or z.shape[1] != self.channels:
            raise ValueError(
                f"{type(self).__name__} expects (B, {self.channels}, H, W), got {tuple(z.shape)}"
            )
        batch, _, height, width = z.shape
        q, k, v = (self._heads(proj(z)) for proj in (self.query, self.key, self.value))
        attended = self.attend(q, k, v).transpose(2, 3)
        return z + self.out(attended.reshape(batch, self.inner_channels, height, width))

    def _heads(self, t: Tensor) -> Tensor:
        """(B, inner, H, W) -> (B, heads, N, d_h)."""
        batch = t.shape[0]
        return t.reshape(batch, self.heads, self.inner_channels // self.heads, -1).transpose(2, 3)

    def extra_repr(self) -> str:
        return f"channels={self.channels}, inner_channels={self.inner_channels}, heads={self.heads}"


class SelfAttention2d(_Attention2d):
    """Non-local self-attention with the N x N matrix materialised (memory O(N^2)).

    Args:
        channels: input/output channels C.
        inner_channels: width of queries, keys and values (default C: four C x C projections,
            about 4 C^2 parameters, the size of the paper's SA).
        heads: attention heads.
    """

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        return torch.softmax(scores, dim=-1) @ v


class SDPAttention2d(_Attention2d):
    """The same attention through ``F.scaled_dot_product_attention`` (fused where available).

    Arguments as ``SelfAttention2d``. The fused kernels (flash attention on the CPU and the
    GPU) need a unit stride along d_h; the projections give (B, heads, N, d_h) views with
    stride N there, so they are made contiguous first (O(N d) copies), otherwise SDPA falls
    back to its math path, which materialises the N x N matrix like ``SelfAttention2d``.
    """

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return F.scaled_dot_product_attention(q.contiguous(), k.contiguous(), v.contiguous())
