"""Local GAN networks for the far-twin canvases: the context block is their only global path.

Generator: a spatial noise map z (B, ``noise``, 8, 8) of i.i.d. N(0, 1) entries, with two fixed
coordinate channels (the same for every sample: they tell a location where it is, they carry no
sample's information) -> conv1x1 -> w, PixelNorm, ReLU -> gated context (w channels, 8x8) ->
nearest upsampling x2 -> conv3x3 (w, 16x16), PixelNorm, ReLU -> conv3x3 (w -> 4) -> pixel
shuffle -> (1, 32, 32) -> tanh. No linear layer sees the whole map, no batch statistics
(PixelNorm normalises each location's channel vector): without the context block an output
pixel depends on a few noise cells only (``experiments.generation.receptive``).

Discriminator (spectral norm on every convolution, the context block's included): image
(B, 1, 32, 32) -> pixel unshuffle -> (4, 16, 16) with two coordinate channels -> conv3x3 -> w,
LeakyReLU -> conv4x4 stride 2 -> (2w, 8x8), LeakyReLU -> gated context (2w, 8x8) -> conv1x1,
LeakyReLU -> conv1x1 -> one logit per location (8x8) -> their mean. No layer but the context
block sees the whole canvas.

The context module is any ``(B, C, 8, 8) -> (B, C, 8, 8)`` module; it is wrapped in a gate
(``z + gamma * (context(z) - z)``, gamma initialised 0: SAGAN's and HamGAN's), so every arm
starts as the no-context network and gamma(t) shows how much context each network uses. In the
discriminator the context block's BatchNorm layers are replaced by identities (HamGAN's
``use_bn=False``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from experiments.models.gan import ZeroGate, apply_spectral_norm, strip_batchnorm
from implicit_ham._core.validation import check_positive_int

NOISE_SIZE = 8
CONTEXT_SIZE = 8
CANVAS = 32
SLOPE = 0.2


def coordinates(size: int, like: Tensor) -> Tensor:
    """(1, 2, size, size) fixed coordinate channels in [-1, 1] (rows, columns)."""
    axis = torch.linspace(-1.0, 1.0, size, device=like.device, dtype=like.dtype)
    rows, cols = torch.meshgrid(axis, axis, indexing="ij")
    return torch.stack([rows, cols]).unsqueeze(0)


def with_coordinates(x: Tensor) -> Tensor:
    """(B, C, S, S) -> (B, C + 2, S, S): the coordinate channels appended."""
    grid = coordinates(x.shape[-1], x).expand(x.shape[0], -1, -1, -1)
    return torch.cat([x, grid], 1)


class PixelNorm(nn.Module):
    """Each location's channel vector scaled to unit root-mean-square (ProGAN): local, no batch
    or spatial statistics. (B, C, H, W) -> (B, C, H, W)."""

    def forward(self, x: Tensor) -> Tensor:
        """x (B, C, H, W) -> x / sqrt(mean_c x^2 + 1e-8)."""
        return x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + 1e-8)


def pointwise(width: int, depth: int, leaky: bool) -> list[nn.Module]:
    """``depth`` conv1x1 layers on ``width`` channels (PixelNorm + ReLU, or LeakyReLU): depth
    without widening the receptive field."""
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers.append(nn.Conv2d(width, width, 1))
        layers += [nn.LeakyReLU(SLOPE)] if leaky else [PixelNorm(), nn.ReLU()]
    return layers


class LocalGenerator(nn.Module):
    """Noise maps (B, noise, 8, 8) -> images (B, 1, 32, 32) in [-1, 1] (module docstring).

    Args:
        context: the context module on ``width`` channels at 8x8 (gated).
        noise: channels of the noise map. width: channels w at 8x8 and 16x16.
    """

    def __init__(
        self, context: nn.Module, noise: int = 16, width: int = 32, depth: int = 0
    ) -> None:
        super().__init__()
        check_positive_int("LocalGenerator", "noise", noise)
        check_positive_int("LocalGenerator", "width", width)
        check_positive_int("LocalGenerator", "depth", depth, minimum=0)
        self.noise = noise
        self.stem = nn.Sequential(
            nn.Conv2d(noise + 2, width, 1), PixelNorm(), nn.ReLU(), *pointwise(width, depth, False)
        )
        self.context = ZeroGate(context)
        self.up = nn.Sequential(
            nn.Upsample(scale_factor=2, mode="nearest"),
            nn.Conv2d(width, width, 3, padding=1),
            PixelNorm(),
            nn.ReLU(),
            *pointwise(width, depth, False),
        )
        self.head = nn.Sequential(nn.Conv2d(width, 4, 3, padding=1), nn.PixelShuffle(2), nn.Tanh())

    def forward(self, z: Tensor) -> Tensor:
        """z (B, noise, 8, 8) -> (B, 1, 32, 32)."""
        if z.ndim != 4 or z.shape[1:] != (self.noise, NOISE_SIZE, NOISE_SIZE):
            raise ValueError(
                f"LocalGenerator expects noise maps (B, {self.noise}, {NOISE_SIZE}, "
                f"{NOISE_SIZE}), got {tuple(z.shape)}"
            )
        return self.head(self.up(self.context(self.stem(with_coordinates(z)))))

    def noise_like(self, count: int, generator: torch.Generator | None = None) -> Tensor:
        """``count`` noise maps (count, noise, 8, 8) from N(0, 1) with ``generator``."""
        device = next(self.parameters()).device
        shape = (count, self.noise, NOISE_SIZE, NOISE_SIZE)
        return torch.randn(shape, generator=generator, device=device)

    def sample(self, count: int, generator: torch.Generator | None = None) -> Tensor:
        """``count`` images (count, 1, 32, 32) from fresh noise maps."""
        return self(self.noise_like(count, generator))


class LocalDiscriminator(nn.Module):
    """Images (B, 1, 32, 32) -> logits (B,): the mean of 8x8 per-location logits.

    Args:
        context: the context module on ``2 * width`` channels at 8x8 (gated; its BatchNorm
            layers are removed).
        width: channels w at 16x16 (2w at 8x8).
    """

    def __init__(self, context: nn.Module, width: int = 32, depth: int = 0) -> None:
        super().__init__()
        check_positive_int("LocalDiscriminator", "width", width)
        check_positive_int("LocalDiscriminator", "depth", depth, minimum=0)
        self.unshuffle = nn.PixelUnshuffle(2)
        self.body = nn.Sequential(
            nn.Conv2d(4 + 2, width, 3, padding=1),
            nn.LeakyReLU(SLOPE),
            *pointwise(width, depth, True),
            nn.Conv2d(width, 2 * width, 4, stride=2, padding=1),
            nn.LeakyReLU(SLOPE),
        )
        self.context = ZeroGate(strip_batchnorm(context))
        self.head = nn.Sequential(
            nn.Conv2d(2 * width, 2 * width, 1), nn.LeakyReLU(SLOPE), nn.Conv2d(2 * width, 1, 1)
        )
        apply_spectral_norm(self)

    def location_logits(self, x: Tensor) -> Tensor:
        """x (B, 1, 32, 32) -> per-location logits (B, 8, 8)."""
        if x.ndim != 4 or x.shape[1:] != (1, CANVAS, CANVAS):
            raise ValueError(f"LocalDiscriminator expects (B, 1, 32, 32), got {tuple(x.shape)}")
        h = self.body(with_coordinates(self.unshuffle(x)))
        return self.head(self.context(h)).squeeze(1)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, 1, 32, 32) -> (B,) logits."""
        return self.location_logits(x).mean((1, 2))
