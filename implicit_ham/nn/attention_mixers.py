"""Attention token mixers, the baselines of ``HamMixer``: tokens (B, N, C) -> (B, N, C).

Both share one parametrisation (linear maps for queries, keys, values and the output, as
``nn.MultiheadAttention``) and return the mixing term only, like it: a pre-norm block adds the
residual, ``x = x + mixer(norm(x))``. Both are bidirectional by default (no mask): every output
token sees every input token; ``SDPAMixer(causal=True)`` masks the future (output token i sees
input tokens 0 ... i, GPT's and safari's attention), at no extra cost.

* ``SDPAMixer``: softmax attention, ``softmax(Q K^T / sqrt(d_h)) V`` per head, through
  ``torch.nn.functional.scaled_dot_product_attention`` (time O(N^2 d), memory O(N d) with
  a fused kernel, O(N^2) on its math path).
* ``LinearAttentionMixer``: linear attention (Katharopoulos et al., "Transformers are RNNs",
  ICML 2020) with the feature map phi(x) = elu(x) + 1, in its non-causal form
  ``phi(Q) (phi(K)^T V) / (phi(Q) (phi(K)^T 1))`` (time and memory O(N d^2)).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch.nn.functional as F
from torch import Tensor, nn

from implicit_ham._core.validation import check_nonnegative
from implicit_ham.nn.attention import attention_width
from implicit_ham.nn.tokens import check_tokens


def linear_attention(q: Tensor, k: Tensor, v: Tensor, eps: float = 1e-6) -> Tensor:
    """Non-causal linear attention, (..., N, d) x3 -> (..., N, d_v):
    ``phi(q) (phi(k)^T v) / (phi(q) phi(k)^T 1 + eps)``, phi(x) = elu(x) + 1 > 0, so the
    denominator is positive; ``eps`` (the reference implementation's 1e-6) only guards it."""
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    numerator = phi_q @ (phi_k.transpose(-2, -1) @ v)  # (..., N, d) (d, d_v): O(N d d_v)
    denominator = phi_q @ phi_k.sum(dim=-2).unsqueeze(-1)  # (..., N, 1)
    return numerator / (denominator + eps)


class _AttentionMixer(nn.Module, ABC):
    """Shared projections; subclasses define ``attend`` on (B, heads, N, d_h) tensors."""

    def __init__(self, channels: int, inner_channels: int | None = None, heads: int = 1) -> None:
        super().__init__()
        inner = attention_width(type(self).__name__, channels, inner_channels, heads)
        self.channels, self.inner_channels, self.heads = channels, inner, heads
        self.query = nn.Linear(channels, inner)
        self.key = nn.Linear(channels, inner)
        self.value = nn.Linear(channels, inner)
        self.out = nn.Linear(inner, channels)

    @abstractmethod
    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """(B, heads, N, d_h) x3 -> (B, heads, N, d_h)."""

    def forward(self, x: Tensor) -> Tensor:
        """x (B, N, channels) -> the mixing term (B, N, channels)."""
        check_tokens(type(self).__name__, x, self.channels)
        batch, tokens, _ = x.shape
        q, k, v = (
            proj(x).view(batch, tokens, self.heads, -1).transpose(1, 2)  # unit stride in d_h
            for proj in (self.query, self.key, self.value)
        )
        attended = self.attend(q, k, v).transpose(1, 2).reshape(batch, tokens, -1)
        return self.out(attended)

    def extra_repr(self) -> str:
        return f"channels={self.channels}, inner_channels={self.inner_channels}, heads={self.heads}"


class SDPAMixer(_AttentionMixer):
    """Softmax attention over the tokens through ``F.scaled_dot_product_attention``.

    Args:
        channels: C, the token width.
        inner_channels: width of queries, keys and values (default C).
        heads: attention heads (d_h = inner_channels / heads).
        causal: mask the future (``is_causal=True``): output token i sees input tokens
            0 ... i only, as a causal language model's attention (the H3 paper's transformer).
            Default False: bidirectional.
    """

    def __init__(
        self,
        channels: int,
        inner_channels: int | None = None,
        heads: int = 1,
        causal: bool = False,
    ) -> None:
        super().__init__(channels, inner_channels, heads)
        if not isinstance(causal, bool):
            raise TypeError(f"SDPAMixer: causal must be True or False, got {causal!r}")
        self.causal = causal

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, causal={self.causal}"


class LinearAttentionMixer(_AttentionMixer):
    """Linear attention (elu + 1 feature map, non-causal) over the tokens.

    Args:
        channels: C, the token width.
        inner_channels: width of queries, keys and values (default C).
        heads: attention heads (d_h = inner_channels / heads).
        eps: added to the (positive) normaliser ``phi(Q) phi(K)^T 1``; >= 0.
    """

    def __init__(
        self,
        channels: int,
        inner_channels: int | None = None,
        heads: int = 1,
        eps: float = 1e-6,
    ) -> None:
        super().__init__(channels, inner_channels, heads)
        check_nonnegative("LinearAttentionMixer", "eps", eps, "no guard, phi > 0 keeps it positive")
        self.eps = eps

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return linear_attention(q, k, v, self.eps)
