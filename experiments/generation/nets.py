"""Local GAN networks for the far-twin canvases: the context block is their only global path.

Both networks work on a grid of 4 x 4 cells of 8 x 8 pixels; each digit of a far-twin canvas
fills one cell (``experiments.data.far_twins``), the two digits three cells apart. Every layer
but the context block acts on each cell alone (1x1 convolutions on the 4 x 4 grid, the cells'
pixels moved to channels and back by pixel (un)shuffling): a per-cell MLP, weights shared over
the cells.

Generator: a noise map z (B, ``noise``, 4, 4) of i.i.d. N(0, 1) entries, one vector a cell ->
conv1x1 -> w, plus a learned position embedding (1, w, 4, 4) (the same for every sample: it
tells a cell where it is and carries no sample's information) -> PixelNorm, ReLU, then
``depth - 1`` more conv1x1 + PixelNorm + ReLU -> gated context (w channels, 4x4) -> ``after``
conv1x1 + PixelNorm + ReLU -> conv1x1 -> 64 channels -> pixel shuffle (x8) -> (1, 32, 32) ->
tanh. With a small ``depth`` and a larger ``after`` the cells mix their noise before the
per-cell layers decide what to draw.

Discriminator (spectral norm on every convolution, the context block's included): image
(B, 1, 32, 32) -> pixel unshuffle (x8) -> (64, 4, 4) -> conv1x1 -> w, plus a learned position
embedding -> LeakyReLU -> conv1x1, LeakyReLU -> gated context (w, 4x4) -> conv1x1, LeakyReLU ->
conv1x1 -> one logit per cell (4x4); the hinge loss is taken per cell and averaged (PatchGAN's).

Without the context block an output pixel depends on the noise vector of its own cell only and
a logit on the pixels of its own cell only (``experiments.generation.receptive`` measures it):
no path but the context block joins the two digits. The position embeddings are what lets a
per-cell network leave the 14 empty cells blank (with two fixed coordinate channels instead,
both networks put digits in any cell: the discriminator could not tell a blank cell from a
faint one). No layer uses batch statistics (PixelNorm normalises each location's channel
vector).

The context module is any ``(B, C, 4, 4) -> (B, C, 4, 4)`` module; it is wrapped in a gate
(``z + gamma * (context(z) - z)``). The generator's gamma starts at 0 (SAGAN's and HamGAN's), so
its context path opens only as training asks for it and gamma(t) shows how much context it uses.
The discriminator's gamma starts at ``gate_init`` (``GanJob.d_gate_init`` in the jobs): with
gamma at 0 its context block gets no gradient, and the supervised pairing check
(``experiments.generation.pairing_check``, its numbers on the page) stays at chance. In the
discriminator the context block's BatchNorm layers are replaced by identities (HamGAN's
``use_bn=False``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from experiments.models.gan import ZeroGate, apply_spectral_norm, strip_batchnorm
from implicit_ham.plugins import check_positive_int

NETWORK = "cell_mlp"  # the design's name in the job definitions (GanJob.network)
GRID = 4  # cells per side: the noise map's and the context block's resolution
CELL = 8  # pixels per cell side
CANVAS = GRID * CELL
SLOPE = 0.2


class PixelNorm(nn.Module):
    """Each location's channel vector scaled to unit root-mean-square (ProGAN): local, no batch
    or spatial statistics. (B, C, H, W) -> (B, C, H, W)."""

    def forward(self, x: Tensor) -> Tensor:
        """x (B, C, H, W) -> x / sqrt(mean_c x^2 + 1e-8)."""
        return x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + 1e-8)


def pointwise(width_in: int, width: int, depth: int) -> list[nn.Module]:
    """``depth`` conv1x1 layers (``width_in`` -> ``width`` -> ... -> ``width``), each followed
    by PixelNorm and ReLU: per-cell depth without any spatial mixing."""
    layers: list[nn.Module] = []
    for i in range(depth):
        layers += [nn.Conv2d(width_in if i == 0 else width, width, 1), PixelNorm(), nn.ReLU()]
    return layers


class LocalGenerator(nn.Module):
    """Noise maps (B, noise, 4, 4) -> images (B, 1, 32, 32) in [-1, 1] (module docstring).

    Args:
        context: the context module on ``width`` channels at 4x4 (gated).
        noise: channels of the noise map. width: channels w of the per-cell layers.
        depth: conv1x1 layers before the context block (>= 1).
        after: conv1x1 + PixelNorm + ReLU layers between the context block and the output
            conv1x1 (>= 1).
    """

    def __init__(
        self, context: nn.Module, noise: int = 32, width: int = 128, depth: int = 2,
        after: int = 1,
    ) -> None:  # fmt: skip
        super().__init__()
        check_positive_int("LocalGenerator", "noise", noise)
        check_positive_int("LocalGenerator", "width", width)
        check_positive_int("LocalGenerator", "depth", depth)
        check_positive_int("LocalGenerator", "after", after)
        self.noise = noise
        self.embed = nn.Conv2d(noise, width, 1)
        self.position = nn.Parameter(torch.randn(1, width, GRID, GRID))
        self.stem = nn.Sequential(PixelNorm(), nn.ReLU(), *pointwise(width, width, depth - 1))
        self.context = ZeroGate(context)
        self.decode = nn.Sequential(
            *pointwise(width, width, after), nn.Conv2d(width, CELL * CELL, 1),
            nn.PixelShuffle(CELL),
            nn.Tanh(),
        )

    def forward(self, z: Tensor) -> Tensor:
        """z (B, noise, 4, 4) -> (B, 1, 32, 32)."""
        if z.ndim != 4 or z.shape[1:] != (self.noise, GRID, GRID):
            raise ValueError(
                f"LocalGenerator expects noise maps (B, {self.noise}, {GRID}, {GRID}), got "
                f"{tuple(z.shape)}"
            )
        return self.decode(self.context(self.stem(self.embed(z) + self.position)))

    def noise_like(self, count: int, generator: torch.Generator | None = None) -> Tensor:
        """``count`` noise maps (count, noise, 4, 4) from N(0, 1) with ``generator``."""
        device = next(self.parameters()).device
        return torch.randn((count, self.noise, GRID, GRID), generator=generator, device=device)

    def sample(self, count: int, generator: torch.Generator | None = None) -> Tensor:
        """``count`` images (count, 1, 32, 32) from fresh noise maps."""
        return self(self.noise_like(count, generator))


class LocalDiscriminator(nn.Module):
    """Images (B, 1, 32, 32) -> 4x4 per-cell logits (B, 4, 4).

    Args:
        context: the context module on ``width`` channels at 4x4 (gated; its BatchNorm layers
            are removed).
        width: channels w of the per-cell layers.
        gate_init: the context gate's initial gamma (0: the no-context network at the start).
    """

    def __init__(self, context: nn.Module, width: int = 128, gate_init: float = 0.0) -> None:
        super().__init__()
        check_positive_int("LocalDiscriminator", "width", width)
        self.unshuffle = nn.PixelUnshuffle(CELL)
        self.embed = nn.Conv2d(CELL * CELL, width, 1)
        self.position = nn.Parameter(torch.randn(1, width, GRID, GRID))
        self.body = nn.Sequential(
            nn.LeakyReLU(SLOPE),
            nn.Conv2d(width, width, 1),
            nn.LeakyReLU(SLOPE),
        )
        self.context = ZeroGate(strip_batchnorm(context), init=gate_init)
        self.head = nn.Sequential(
            nn.Conv2d(width, width, 1), nn.LeakyReLU(SLOPE), nn.Conv2d(width, 1, 1)
        )
        apply_spectral_norm(self)

    def location_logits(self, x: Tensor) -> Tensor:
        """x (B, 1, 32, 32) -> per-cell logits (B, 4, 4)."""
        if x.ndim != 4 or x.shape[1:] != (1, CANVAS, CANVAS):
            raise ValueError(
                f"LocalDiscriminator expects (B, 1, {CANVAS}, {CANVAS}), got {tuple(x.shape)}"
            )
        h = self.body(self.embed(self.unshuffle(x)) + self.position)
        return self.head(self.context(h)).squeeze(1)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, 1, 32, 32) -> (B, 4, 4) per-cell logits (the hinge loss is taken per cell and
        averaged, PatchGAN's way: with a loss on the mean logit the digit cells' logits alone
        would meet the margin and the blank cells would go unjudged)."""
        return self.location_logits(x)
