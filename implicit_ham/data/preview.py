"""Save a PNG grid of segmentation samples beside their colour-coded masks."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image
from torch import Tensor

from ..validation import check_positive_int

logger = logging.getLogger(__name__)

MASK_PALETTE = np.array(
    [
        (0, 0, 0),
        (230, 25, 75),
        (60, 180, 75),
        (255, 225, 25),
        (0, 130, 200),
        (245, 130, 48),
        (145, 30, 180),
        (70, 240, 240),
        (240, 50, 230),
        (210, 245, 60),
        (250, 190, 212),
        (0, 128, 128),
        (220, 190, 255),
        (170, 110, 40),
        (255, 250, 200),
        (128, 0, 0),
        (170, 255, 195),
        (128, 128, 0),
        (255, 215, 180),
        (0, 0, 128),
        (128, 128, 128),
    ],
    dtype=np.uint8,
)
IGNORE_COLOUR = (255, 255, 255)


def colourize_mask(mask: Tensor, ignore_index: int = 255) -> np.ndarray:
    """uint8 RGB ``(H, W, 3)`` of an int ``(H, W)`` label mask; ``ignore_index`` is white.

    Labels beyond the palette (21 colours, label 0 black) wrap around it.
    """
    labels = mask.detach().cpu().numpy().astype(np.int64)
    rgb = MASK_PALETTE[labels % len(MASK_PALETTE)]
    rgb[labels == ignore_index] = IGNORE_COLOUR
    return rgb


def save_sample_grid(
    samples: Sequence[tuple[Tensor, Tensor]],
    path: str | Path,
    columns: int = 4,
    scale: int = 3,
    ignore_index: int = 255,
) -> Path:
    """Write a PNG with each ``(image, mask)`` pair shown as image | mask, ``columns`` pairs a row.

    Args:
        samples: pairs of a float ``(3, H, W)`` image in [0, 1] and an int ``(H, W)`` mask, all
            of one size (e.g. ``[dataset[i] for i in range(8)]``).
        path: the PNG file to write; parent folders are created.
        columns: pairs per row.
        scale: nearest-neighbour upscaling factor, so textures stay visible.
        ignore_index: label drawn white in the masks.

    Returns:
        The path written.
    """
    check_positive_int("save_sample_grid", "columns", columns)
    check_positive_int("save_sample_grid", "scale", scale)
    if not samples:
        raise ValueError("save_sample_grid: samples is empty; pass at least one (image, mask) pair")
    tiles = [
        np.concatenate([_image_to_uint8(image), colourize_mask(mask, ignore_index)], axis=1)
        for image, mask in samples
    ]
    height, width, _ = tiles[0].shape
    gap = 2
    rows = -(-len(tiles) // columns)
    canvas = np.full(
        (rows * (height + gap) + gap, columns * (width + gap) + gap, 3), 128, dtype=np.uint8
    )
    for n, tile in enumerate(tiles):
        top = gap + (n // columns) * (height + gap)
        left = gap + (n % columns) * (width + gap)
        canvas[top : top + height, left : left + width] = tile
    canvas = canvas.repeat(scale, axis=0).repeat(scale, axis=1)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(canvas).save(path)
    logger.info("wrote %d samples to %s", len(tiles), path)
    return path


def _image_to_uint8(image: Tensor) -> np.ndarray:
    """uint8 ``(H, W, 3)`` from a float ``(3, H, W)`` image in [0, 1] (grey images repeated)."""
    array = image.detach().cpu().float().clamp(0, 1).numpy()
    if array.shape[0] == 1:
        array = array.repeat(3, axis=0)
    return (array.transpose(1, 2, 0) * 255).round().astype(np.uint8)
