"""TwoStreamSegmenter and its parameter-free global features, checked against direct loops."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from experiments.models import (
    ColourHistogram,
    GridPositionCode,
    TwoStreamSegmenter,
    context_channels,
)
from implicit_ham.nn.context import make_context


def _histogram_reference(image: np.ndarray, bins: int, cell: int) -> np.ndarray:
    """(C, H, W) in [0, 1] -> (bins ** C, H / cell, W / cell) by counting pixels per cell."""
    channels, height, width = image.shape
    out = np.zeros((bins**channels, height // cell, width // cell))
    for y in range(height):
        for x in range(width):
            index = 0
            for c in range(channels):
                level = min(int(np.floor(image[c, y, x] * bins)), bins - 1)
                index = index * bins + level
            out[index, y // cell, x // cell] += 1.0 / cell**2
    return out


def test_colour_histogram_counts_the_pixels_of_each_cell_per_bin() -> None:
    generator = torch.Generator().manual_seed(0)
    image = torch.rand(2, 3, 8, 12, generator=generator, dtype=torch.float64)
    image[0, :, 0, 0] = 1.0  # the top edge of [0, 1] falls in the last bin
    histogram = ColourHistogram(3, bins=2)(image, (2, 3))
    for b in range(2):
        expected = _histogram_reference(image[b].numpy(), bins=2, cell=4)
        np.testing.assert_allclose(histogram[b].numpy(), expected, atol=1e-12)


def test_colour_histogram_rejects_a_wrong_channel_count() -> None:
    with pytest.raises(ValueError, match="in_channels"):
        ColourHistogram(3)(torch.rand(1, 1, 8, 8), (2, 2))


def test_grid_position_code_marks_each_cell_with_its_block_only() -> None:
    code = GridPositionCode(grid=3)(torch.zeros(2, 5, 6, 7))
    assert code.shape == (2, 9, 6, 7)
    for i in range(6):
        for j in range(7):
            expected = np.zeros(9)
            expected[(i * 3 // 6) * 3 + j * 3 // 7] = 1.0
            np.testing.assert_array_equal(code[1, :, i, j].numpy(), expected)


def test_without_context_a_pixel_ignores_pixels_far_away() -> None:
    """With the identity context every stream is local: changing the image more than
    ~3 cells (12 px) beyond the backbone's 17-px window leaves a pixel's logits unchanged."""
    torch.manual_seed(0)
    model = TwoStreamSegmenter(3, 5, make_context("none", context_channels(3)), width=8).eval()
    image = torch.rand(1, 3, 64, 64)
    changed = image.clone()
    changed[:, :, :24] = torch.rand(1, 3, 24, 64)
    with torch.no_grad():
        before, after = model(image), model(changed)
    assert torch.equal(before[..., 48:, :], after[..., 48:, :])
    assert not torch.equal(before[..., :24, :], after[..., :24, :])


def test_the_context_module_must_take_the_global_channels() -> None:
    model = TwoStreamSegmenter(3, 5, make_context("none", 12), width=8)
    with pytest.raises(ValueError, match="IdentityContext expects"):
        model(torch.rand(1, 3, 32, 32))
