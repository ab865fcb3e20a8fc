"""A small GAN for 32x32 one-channel canvases with a swappable context block at 16x16 in both
networks (the layout of HamGAN / SAGAN at laptop scale).

Generator: z (B, z_dim) -> Linear -> (2w, 4, 4) -> [up x2, conv3x3, BN, ReLU] to (w, 8, 8) and
(w, 16, 16) -> context (w channels, 16x16) -> conv3x3 (w -> w/2), BN, ReLU -> conv3x3
(w/2 -> 4) -> pixel shuffle -> (1, 32, 32) -> tanh.

Discriminator (spectral norm on every conv and linear, the context block's included): image
(B, 1, 32, 32) -> pixel unshuffle -> (4, 16, 16) -> conv3x3 -> w, ReLU -> context (w, 16x16) ->
conv3x3 stride 2 (2w, 8x8), ReLU -> conv3x3 stride 2 (2w, 4x4), ReLU -> conv4x4 (4w, 1x1),
ReLU -> linear -> one logit.

The pixel (un)shuffle at 32x32 keeps the arithmetic low (both networks compute at 16x16 and
below), so a CPU trains a few thousand steps in minutes; the parameters sit mostly in the
generator's input projection and the discriminator's last 4x4 convolution.

The context module is any ``(B, w, 16, 16) -> (B, w, 16, 16)`` module (``make_context``); it is
wrapped in ``ZeroGate`` (``z + gamma * (context(z) - z)``, gamma initialised 0: SAGAN's and
HamGAN's ``sigma_ratio``), so every arm starts as the no-context network. In the discriminator
the context block's BatchNorm layers are replaced by identities: HamGAN builds its
discriminator's Hamburger with ``use_bn=False`` (``gan/HamGAN/discriminator.py`` of the
official code).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn.utils.parametrizations import spectral_norm

from implicit_ham.plugins import check_positive_int

CONTEXT_SIZE = 16


class ZeroGate(nn.Module):
    """``z + gamma * (context(z) - z)`` with a learnable scalar gamma, initialised 0 (SAGAN's
    and HamGAN's) unless ``init`` says otherwise.

    Args:
        context: a (B, C, H, W) -> (B, C, H, W) module.
        init: gamma's initial value (finite).
    """

    def __init__(self, context: nn.Module, init: float = 0.0) -> None:
        super().__init__()
        if not math.isfinite(init):
            raise ValueError(f"ZeroGate: init must be finite, got {init!r}")
        self.context = context
        self.gamma = nn.Parameter(torch.full((), float(init)))

    def forward(self, z: Tensor) -> Tensor:
        """z (B, C, H, W) -> (B, C, H, W)."""
        return z + self.gamma * (self.context(z) - z)


def strip_batchnorm(module: nn.Module) -> nn.Module:
    """Replace every ``BatchNorm2d`` inside ``module`` by ``nn.Identity`` (in place); returns it."""
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d):
            setattr(module, name, nn.Identity())
        else:
            strip_batchnorm(child)
    return module


def apply_spectral_norm(module: nn.Module) -> nn.Module:
    """Spectral normalisation (one power iteration per training forward) on every ``Conv2d``
    and ``Linear`` inside ``module`` (in place); returns it."""
    for name, child in module.named_children():
        if isinstance(child, (nn.Conv2d, nn.Linear)):
            setattr(module, name, spectral_norm(child))
        else:
            apply_spectral_norm(child)
    return module


def _up_block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Upsample(scale_factor=2, mode="nearest"),
        nn.Conv2d(c_in, c_out, 3, padding=1),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
    )


class Generator(nn.Module):
    """z (B, z_dim) -> images (B, 1, 32, 32) in [-1, 1].

    Args:
        context: the context module on ``width`` channels at 16x16 (gated by ``ZeroGate``).
        z_dim: latent size. width: channels w at 8x8 and 16x16 (2w at 4x4).
    """

    def __init__(self, context: nn.Module, z_dim: int = 64, width: int = 64) -> None:
        super().__init__()
        check_positive_int("Generator", "z_dim", z_dim)
        check_positive_int("Generator", "width", width, minimum=2)
        self.z_dim, self.width = z_dim, width
        self.project = nn.Linear(z_dim, 2 * width * 16)
        self.stem = nn.Sequential(nn.BatchNorm2d(2 * width), nn.ReLU(inplace=True))
        self.up8 = _up_block(2 * width, width)
        self.up16 = _up_block(width, width)
        self.context = ZeroGate(context)
        self.head = nn.Sequential(
            nn.Conv2d(width, width // 2, 3, padding=1),
            nn.BatchNorm2d(width // 2),
            nn.ReLU(inplace=True),
            nn.Conv2d(width // 2, 4, 3, padding=1),
            nn.PixelShuffle(2),
            nn.Tanh(),
        )

    def forward(self, z: Tensor) -> Tensor:
        """z (B, z_dim) -> (B, 1, 32, 32)."""
        h = self.stem(self.project(z).view(z.shape[0], 2 * self.width, 4, 4))
        return self.head(self.context(self.up16(self.up8(h))))

    def sample(self, count: int, generator: torch.Generator | None = None) -> Tensor:
        """``count`` images (count, 1, 32, 32), latents drawn from N(0, I) with ``generator``."""
        device = self.project.weight.device
        z = torch.randn(count, self.z_dim, generator=generator, device=device)
        return self(z)


class Discriminator(nn.Module):
    """images (B, 1, 32, 32) -> logits (B,); spectral norm everywhere (see module docstring).

    Args:
        context: the context module on ``width`` channels at 16x16 (gated by ``ZeroGate``; its
            BatchNorm layers are removed).
        width: channels w at 16x16 (2w at 8x8 and 4x4).
    """

    def __init__(self, context: nn.Module, width: int = 64) -> None:
        super().__init__()
        check_positive_int("Discriminator", "width", width)
        self.width = width
        self.stem = nn.Sequential(
            nn.PixelUnshuffle(2), nn.Conv2d(4, width, 3, padding=1), nn.ReLU()
        )
        self.context = ZeroGate(strip_batchnorm(context))
        self.down = nn.Sequential(
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(2 * width, 2 * width, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(2 * width, 4 * width, 4),  # 4x4 -> 1x1: cheap, most of the parameters
            nn.ReLU(),
        )
        self.linear = nn.Linear(4 * width, 1)
        apply_spectral_norm(self)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, 1, 32, 32) -> (B,) logits."""
        if x.ndim != 4 or x.shape[1:] != (1, 32, 32):
            raise ValueError(f"Discriminator expects (B, 1, 32, 32), got {tuple(x.shape)}")
        h = self.down(self.context(self.stem(x)))
        return self.linear(h.flatten(1)).squeeze(1)


def parameter_count(module: nn.Module) -> int:
    """Trainable parameters of ``module``."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)
