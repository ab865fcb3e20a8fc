"""A masked-cell model of far-twin canvases whose only path between cells is the context block.

The canvas (B, 1, 32, 32) is a 4 x 4 grid of 8 x 8 cells (``experiments.data.far_twins``); the
right digit's cell is blanked in the input and the model predicts its 64 pixels from the rest
(``experiments.data.far_twins.masked_cell_loss``): a conditional model of the right digit given
the left one, trained by a plain regression (no game, no sampling noise).

Network (every layer but the context block acts on each cell alone, weights shared over the
cells): pixel unshuffle (x8) -> (64, 4, 4), each cell's pixels as channels -> conv1x1 -> w plus a
learned position embedding (1, w, 4, 4) -> ReLU -> ``depth - 1`` more conv1x1 + ReLU -> gated
context block (``z + gamma * (context(z) - z)``, w channels on the 4 x 4 grid) -> ``after``
conv1x1 + ReLU -> conv1x1 -> 64 -> pixel shuffle -> (1, 32, 32). No batch statistics: the
context module's BatchNorm layers (a Hamburger's) are replaced by identities (HamGAN's
``use_bn=False``; with them, a 30-epoch NMF one-step job's held-out loss, computed with the
running statistics, rose from 4.8 to 100-600 while its training loss stayed near 4.5).

Without a context block (``none``: the identity) an output cell depends on its own input cell
only: the masked cell's prediction is then the same for every canvas (its input is blank), the
mean right digit. A context that carries the left digit's class lets it predict the class's mean
right digit instead; the held-out loss measures exactly that.

The shared layers (everything but the context module and the gate) are initialised from their
own generator seeded by ``init_seed``, so arms with different context blocks start from the same
shared weights whatever the context module's own initialisation draws.

``CellPairingClassifier`` is the same per-cell network with a 2-channel head: real far-twin
canvases vs recombined ones (``experiments.data.far_twins.pairing_canvases``), its logits the
mean of the 16 cells' logits. A mean of per-cell scores is a sum of functions of one cell each,
so without a context block it cannot tell whether two cells hold digits of one class (real and
recombined canvases have the same distribution of each cell alone): the check of whether a
context block carries the pairing at all.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from implicit_ham.plugins import check_positive_int

GRID = 4  # cells per side
CELL = 8  # pixels per cell side


class ContextGate(nn.Module):
    """``z + gamma * (context(z) - z)`` with a learnable scalar gamma (SAGAN's and HamGAN's
    ``sigma_ratio``; 0: the context block is off, 1: its output alone).

    Args:
        context: a (B, C, H, W) -> (B, C, H, W) module.
        init: gamma's initial value (finite).
    """

    def __init__(self, context: nn.Module, init: float) -> None:
        super().__init__()
        if not math.isfinite(init):
            raise ValueError(f"ContextGate: init must be finite, got {init!r}")
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


class MaskedCellModel(nn.Module):
    """Masked canvases (B, 1, 32, 32) -> predicted canvases (B, 1, 32, 32) (module docstring).

    Args:
        context: a (B, width, 4, 4) -> (B, width, 4, 4) module, wrapped in a ``ContextGate``
            (its BatchNorm layers replaced by identities, in place).
        width: channels w of the per-cell layers.
        depth: conv1x1 layers before the context block (>= 1).
        after: conv1x1 + ReLU layers after the context block (>= 0).
        gate_init: the gate's initial gamma (1: the context block's output from the start).
        init_seed: seeds the shared layers' initialisation (module docstring).
    """

    outputs = CELL * CELL  # channels of each cell's output: its 64 pixels

    def __init__(
        self,
        context: nn.Module,
        width: int = 64,
        *,
        depth: int = 2,
        after: int = 2,
        gate_init: float = 1.0,
        init_seed: int = 0,
    ) -> None:
        super().__init__()
        check_positive_int("MaskedCellModel", "width", width)
        check_positive_int("MaskedCellModel", "depth", depth)
        check_positive_int("MaskedCellModel", "after", after, minimum=0)
        pixels = CELL * CELL
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(init_seed)
            self.embed = nn.Conv2d(pixels, width, 1)
            self.position = nn.Parameter(0.02 * torch.randn(1, width, GRID, GRID))
            before: list[nn.Module] = [nn.ReLU()]
            for _ in range(depth - 1):
                before += [nn.Conv2d(width, width, 1), nn.ReLU()]
            self.before = nn.Sequential(*before)
            head: list[nn.Module] = []
            for _ in range(after):
                head += [nn.Conv2d(width, width, 1), nn.ReLU()]
            head.append(nn.Conv2d(width, self.outputs, 1))
            self.head = nn.Sequential(*head)
        self.gate = ContextGate(strip_batchnorm(context), init=gate_init)

    def cells(self, canvas: Tensor) -> Tensor:
        """Canvases (B, 1, 32, 32) -> per-cell outputs (B, outputs, 4, 4) (a cell's 64 pixels)."""
        if canvas.shape[1:] != (1, GRID * CELL, GRID * CELL):
            raise ValueError(
                f"MaskedCellModel: expected canvases (B, 1, {GRID * CELL}, {GRID * CELL}), "
                f"got {tuple(canvas.shape)}"
            )
        z = self.before(self.embed(nn.functional.pixel_unshuffle(canvas, CELL)) + self.position)
        return self.head(self.gate(z))

    def forward(self, canvas: Tensor) -> Tensor:
        """Canvases (B, 1, 32, 32) -> predicted canvases (B, 1, 32, 32)."""
        return nn.functional.pixel_shuffle(self.cells(canvas), CELL)


class CellPairingClassifier(MaskedCellModel):
    """Canvases (B, 1, 32, 32) -> logits (B, 2) of "recombined" (0) and "real" (1): the mean
    over the 16 cells of the per-cell network's 2 outputs (module docstring). Arguments as
    ``MaskedCellModel``'s."""

    outputs = 2

    def forward(self, canvas: Tensor) -> Tensor:
        """Canvases (B, 1, 32, 32) -> logits (B, 2)."""
        return self.cells(canvas).mean((2, 3))
