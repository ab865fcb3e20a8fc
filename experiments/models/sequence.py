"""Sequence classifiers of the public benchmarks (H3 synthetics, MNIST-1D): a pre-norm
transformer on tokens whose mixer is any token-mixer context, a 1-D CNN with an optional
global-context block, and the MLP / GRU baselines of MNIST-1D."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from implicit_ham.nn.identity import IdentityContext


class TokenTransformer(nn.Module):
    """Token ids (B, N) int64 -> logits (B, num_classes) at the final position.

    Token and learned position embeddings (width d), ``layers`` pre-norm blocks
    ``x = x + mixer(norm(x)); x = x + mlp(norm(x))`` (MLP width 4 d, GELU), a final norm and a
    linear head on the last token: the H3 synthetics' transformer (2 layers, d_model 32, one
    head), scored on the final position only. ``mixers`` are token mixers (B, N, d) ->
    (B, N, d) (``make_context("sdpa_mixer" | "nmf_mixer" | ..., d)``); an ``IdentityContext``
    (context ``none``) means no mixer: that sub-block is left out, so no token sees another.

    Args:
        vocab_size: token ids in [0, vocab_size). length: N, the sequence length.
        num_classes: outputs. mixers: one per layer. width: d. dropout: on the embeddings.
    """

    def __init__(
        self,
        vocab_size: int,
        length: int,
        num_classes: int,
        mixers: list[nn.Module],
        width: int = 32,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, width)
        self.position = nn.Parameter(torch.randn(length, width) * 0.02)
        self.dropout = nn.Dropout(dropout)
        self.mix_norms = nn.ModuleList(nn.LayerNorm(width) for _ in mixers)
        self.mixers = nn.ModuleList(
            None if isinstance(m, IdentityContext) else m  # type: ignore[misc]
            for m in mixers
        )
        self.mlp_norms = nn.ModuleList(nn.LayerNorm(width) for _ in mixers)
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
            for _ in mixers
        )
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, num_classes)
        self.length = length

    def forward(self, tokens: Tensor) -> Tensor:
        """tokens (B, N) int64, N = ``length`` -> logits (B, num_classes)."""
        if tokens.dim() != 2 or tokens.shape[1] != self.length:
            raise ValueError(
                f"TokenTransformer expects token ids (B, {self.length}), got {tuple(tokens.shape)}"
            )
        x = self.dropout(self.embed(tokens) + self.position)
        for mix_norm, mixer, mlp_norm, mlp in zip(
            self.mix_norms, self.mixers, self.mlp_norms, self.mlps, strict=True
        ):
            if mixer is not None:
                x = x + mixer(mix_norm(x))
            x = x + mlp(mlp_norm(x))
        return self.head(self.norm(x[:, -1]))


class ConvClassifier1d(nn.Module):
    """Sequences (B, C_in, N) -> logits (B, num_classes): two 1-D convolution layers (kernel 5,
    ReLU), the context block on (B, width, N) (a 2-D context gets (B, width, 1, N), which
    Hamburger flattens to the same N positions), a residual ReLU, global average pooling
    and a linear head. With context ``none`` it is a plain local CNN."""

    def __init__(
        self, in_channels: int, num_classes: int, context: nn.Module, width: int = 32
    ) -> None:
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv1d(in_channels, width, 5, padding=2),
            nn.ReLU(),
            nn.Conv1d(width, width, 5, padding=2),
            nn.ReLU(),
        )
        self.context = context
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, C_in, N) -> logits (B, num_classes)."""
        h = self.backbone(x)
        g = self.context(h.unsqueeze(2)).squeeze(2)
        return self.head(torch.relu(h + g).mean(-1))


class MLPClassifier(nn.Module):
    """The MNIST-1D package's MLP baseline: (B, C_in, N) flattened -> ``h = relu(W1 x)``,
    ``h = h + relu(W2 h)`` (a residual hidden layer of ``width``) -> logits ``W3 h``."""

    def __init__(self, in_features: int, num_classes: int, width: int = 100) -> None:
        super().__init__()
        self.flatten = nn.Flatten()
        self.linear1 = nn.Linear(in_features, width)
        self.linear2 = nn.Linear(width, width)
        self.linear3 = nn.Linear(width, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, C_in, N) -> logits (B, num_classes)."""
        h = torch.relu(self.linear1(self.flatten(x)))
        return self.linear3(h + torch.relu(self.linear2(h)))


class StridedConvClassifier1d(nn.Module):
    """The MNIST-1D package's CNN baseline: three strided 1-D convolutions of ``width``
    channels (kernel 5 then 3, 3; stride 2, padding 1; ReLU), the features flattened into a
    linear head (no pooling: on N = 40 it reads 5 positions x width)."""

    def __init__(self, in_channels: int, length: int, num_classes: int, width: int = 25) -> None:
        super().__init__()
        self.convs = nn.Sequential(
            nn.Conv1d(in_channels, width, 5, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv1d(width, width, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv1d(width, width, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Flatten(),
        )
        positions = (length - 3) // 2 + 1  # after the kernel-5 layer
        for _ in range(2):
            positions = (positions - 1) // 2 + 1  # after each kernel-3 layer
        if positions < 1:
            raise ValueError(
                f"StridedConvClassifier1d: sequences of length {length} are too short for three "
                "stride-2 convolutions (need >= 3)"
            )
        self.head = nn.Linear(width * positions, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, C_in, N) -> logits (B, num_classes)."""
        return self.head(self.convs(x))


class GRUClassifier(nn.Module):
    """The MNIST-1D package's GRU baseline: a bidirectional GRU of ``width`` reads
    (B, C_in, N); its outputs at every position, flattened (N x 2 width), feed a linear head."""

    def __init__(self, in_channels: int, length: int, num_classes: int, width: int = 6) -> None:
        super().__init__()
        self.gru = nn.GRU(in_channels, width, batch_first=True, bidirectional=True)
        self.head = nn.Linear(length * 2 * width, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, C_in, N) -> logits (B, num_classes)."""
        out, _ = self.gru(x.transpose(1, 2))
        return self.head(out.flatten(1))
