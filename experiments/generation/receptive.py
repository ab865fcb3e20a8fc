"""Receptive fields of the generation networks: analytic (a conv stack's layer list) and
measured (a gradient probe: which input locations an output location depends on).

The probe runs the network in float64 on a random input, back-propagates one output location
(the sum over its channels) and reads where the input gradient is non-zero; with random weights
a zero gradient means "does not depend" (exact zeros come from the connectivity, not from
cancellation). The page reports the probe's numbers for the actual networks, with the gates of
their context blocks opened (gamma = 1) and every decomposition's gradient set to BPTT
(``Unroll``): a one-step gradient detaches the bases, which hides the forward dependency the
probe is after (the forward pass is the same under every gradient mode).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from experiments.data.far_twins import DIGIT, LEFT, RIGHT, TOP
from experiments.generation.nets import CANVAS, CELL, GRID, LocalDiscriminator, LocalGenerator
from experiments.models.gan import ZeroGate
from implicit_ham.adjoints.modes import Unroll
from implicit_ham.decompositions.base import Decomposition


def analytic_receptive_field(layers: Sequence[tuple[int, int]]) -> int:
    """Receptive field (in input pixels, one axis) of a stack of convolutions given as
    ``(kernel, stride)`` pairs, first layer first: ``1 + sum_i (k_i - 1) prod_{j<i} s_j``."""
    size, jump = 1, 1
    for kernel, stride in layers:
        if kernel < 1 or stride < 1:
            raise ValueError(
                f"analytic_receptive_field: bad layer (kernel={kernel}, stride={stride})"
            )
        size += (kernel - 1) * jump
        jump *= stride
    return size


def dependency(fn: Callable[[Tensor], Tensor] | nn.Module, x: Tensor, row: int, col: int) -> Tensor:
    """(H_in, W_in) bool: the input locations of ``x`` (1, C, H_in, W_in) that output location
    (row, col) of ``fn(x)`` ((1, C', H, W) or (1, H, W)) depends on (non-zero gradient)."""
    x = x.detach().clone().requires_grad_(True)
    out = fn(x)
    if out.ndim == 3:
        out = out.unsqueeze(1)
    (grad,) = torch.autograd.grad(out[0, :, row, col].sum(), x)
    return grad[0].abs().sum(0) > 0


def extent(mask: Tensor) -> tuple[int, int, int, int]:
    """(first row, last row, first column, last column) of a non-empty bool mask (H, W)."""
    rows = torch.nonzero(mask.any(1)).flatten()
    cols = torch.nonzero(mask.any(0)).flatten()
    if len(rows) == 0:
        raise ValueError("extent: the mask is empty (the output depends on no input)")
    return int(rows[0]), int(rows[-1]), int(cols[0]), int(cols[-1])


def opened(module: nn.Module) -> nn.Module:
    """A float64 copy of ``module`` in eval mode with every context gate set to gamma = 1 and
    every decomposition differentiated by BPTT (module docstring)."""
    clone = copy.deepcopy(module).double().eval()
    for child in clone.modules():
        if isinstance(child, ZeroGate):
            child.gamma.data.fill_(1.0)
        if isinstance(child, Decomposition):
            child.adjoint = Unroll()
    return clone


@dataclass(frozen=True)
class GeneratorField:
    """What the generator's output pixels depend on (noise cells of the 4x4 map, 8 pixels each).

    ``cells``: width (columns = rows) of the noise-cell window of one central output pixel;
    ``pixels``: the same in output pixels (cells x 4); ``digits_share_input``: whether some
    noise cell feeds both a pixel of the left digit and one of the right digit."""

    cells: int
    pixels: int
    digits_share_input: bool


@dataclass(frozen=True)
class DiscriminatorField:
    """What one per-location logit of the discriminator depends on (input pixels).

    ``pixels``: width of the window of a central logit; ``sees_both_digits``: whether some
    logit depends on a pixel of the left digit and one of the right digit."""

    pixels: int
    sees_both_digits: bool


def _digit_pixels() -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    rows = range(TOP, TOP + DIGIT)
    left = [(r, c) for r in rows for c in range(LEFT, LEFT + DIGIT)]
    right = [(r, c) for r in rows for c in range(RIGHT, RIGHT + DIGIT)]
    return left, right


def generator_field(generator: LocalGenerator, seed: int = 0) -> GeneratorField:
    """Probe ``generator`` (gates opened): the noise window of the output pixel at the canvas
    centre and whether the noise cells feeding the left digit and the right digit overlap."""
    net = opened(generator)
    assert isinstance(net, LocalGenerator)
    z = net.noise_like(1, torch.Generator().manual_seed(seed)).double()
    centre = CANVAS // 2
    top, bottom, first, last = extent(dependency(net, z, centre, centre))
    feeds = []
    for pixels in _digit_pixels():
        mask = torch.zeros(z.shape[-2:], dtype=torch.bool)
        for r, c in pixels[:: DIGIT - 1] + pixels[DIGIT - 1 :: DIGIT]:  # the digit's border
            mask |= dependency(net, z, r, c)
        feeds.append(mask)
    cells = max(bottom - top, last - first) + 1
    return GeneratorField(cells, cells * CELL, bool((feeds[0] & feeds[1]).any()))


def discriminator_field(discriminator: LocalDiscriminator, seed: int = 0) -> DiscriminatorField:
    """Probe ``discriminator`` (gates opened): the input window of the logit of an interior
    cell and whether any of the 4x4 logits depends on pixels of both digits."""
    net = opened(discriminator)
    assert isinstance(net, LocalDiscriminator)
    shape = (1, 1, CANVAS, CANVAS)
    x = torch.rand(shape, generator=torch.Generator().manual_seed(seed)).double()
    inner = GRID // 2
    top, bottom, first, last = extent(dependency(net.location_logits, x, inner, inner))
    left, right = _digit_pixels()
    both = False
    for row in range(GRID):
        for col in range(GRID):
            mask = dependency(net.location_logits, x, row, col)
            if any(mask[p] for p in left) and any(mask[p] for p in right):
                both = True
    return DiscriminatorField(max(bottom - top, last - first) + 1, both)
