"""Procedural generator of legend_seg images: segmentation that needs global context.

An image is split into a *legend strip* (the top ``legend_height`` rows) and a *field* below it.
The strip shows ``C`` texture patches in class order, left to right, on a white frame. The field
holds a few non-overlapping blobs (rotated ellipses or star-shaped polygons) on a dark
background, each filled with the texture of one legend patch. Each image draws its own ``C``
textures from the bank, in a random order, so a texture says nothing about its class by itself:
only the legend does. A blob's label is ``1 + k`` where ``k`` is the position of its texture in
the legend; the field background is 0; the whole legend strip is ``IGNORE_INDEX`` (255) so that
losses and metrics can skip it.

Everything is drawn from ``np.random.default_rng([seed, stream, index])``, so an image depends
only on those three integers (no state is shared between images).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from experiments.data.shapes import random_blob_mask
from experiments.data.textures import FIELD_BACKGROUND, LEGEND_FRAME, MAX_PERIOD, TEXTURE_BANK
from implicit_ham.plugins import check_positive_int

IGNORE_INDEX = 255
MIN_PATCH = MAX_PERIOD + 2
MIN_FIELD_HEIGHT = 16
BLOB_ATTEMPTS = 50


@dataclass(frozen=True)
class LegendLayout:
    """Where the legend strip, its patches and the field lie in a ``height x width`` image.

    Each legend patch is at least ``MAX_PERIOD + 2`` pixels in both directions, so it shows every
    texture's full period with room to spare.

    Args:
        height, width: image size in pixels.
        num_classes: C, the number of legend patches (blob classes; labels 1..C).
        legend_height: rows of the legend strip (frame included); the field starts below.
    """

    height: int
    width: int
    num_classes: int
    legend_height: int

    def __post_init__(self) -> None:
        owner = "LegendLayout"
        check_positive_int(owner, "num_classes", self.num_classes)
        if self.num_classes > len(TEXTURE_BANK):
            raise ValueError(
                f"{owner}: num_classes={self.num_classes} exceeds the texture bank "
                f"({len(TEXTURE_BANK)} textures); use num_classes <= {len(TEXTURE_BANK)}"
            )
        check_positive_int(owner, "legend_height", self.legend_height, minimum=MIN_PATCH + 2)
        min_width = (MIN_PATCH + 2) * self.num_classes
        if self.width < min_width:
            raise ValueError(
                f"{owner}: width {self.width} is too narrow for {self.num_classes} legend patches "
                f"of at least {MIN_PATCH} pixels; use a width >= {min_width} or fewer classes"
            )
        min_height = self.legend_height + MIN_FIELD_HEIGHT
        if self.height < min_height:
            raise ValueError(
                f"{owner}: height {self.height} leaves fewer than {MIN_FIELD_HEIGHT} rows below "
                f"the {self.legend_height}-row legend; use a height >= {min_height} or a "
                "smaller legend_height"
            )

    @classmethod
    def default(cls, height: int, width: int, num_classes: int) -> LegendLayout:
        """The layout with the default legend height: a fifth of the image, at least 10 rows."""
        return cls(height, width, num_classes, max(MIN_PATCH + 2, height // 5))

    @property
    def patch_boxes(self) -> tuple[tuple[int, int, int, int], ...]:
        """``(y0, y1, x0, x1)`` (end exclusive) of legend patch k, for k = 0..C-1."""
        slot = self.width // self.num_classes
        return tuple(
            (1, self.legend_height - 1, k * slot + 1, (k + 1) * slot - 1)
            for k in range(self.num_classes)
        )

    @property
    def blob_radius_range(self) -> tuple[float, float]:
        """Smallest and largest bounding radius of a blob, in pixels."""
        side = min(self.height - self.legend_height, self.width)
        low = max(4.0, 0.12 * side)
        return low, max(low, 0.28 * side)


@dataclass(frozen=True)
class LegendSegArrays:
    """One generated image as numpy arrays.

    Attributes:
        image: float32 ``(H, W, 3)`` in [0, 1].
        mask: int64 ``(H, W)``: 0 background, 1..C blob classes, ``IGNORE_INDEX`` legend strip.
        instances: int64 ``(H, W)``: 0 outside blobs, b for the pixels of blob b (1-based).
        legend_textures: int64 ``(C,)``: bank index of the texture of legend patch k.
    """

    image: np.ndarray
    mask: np.ndarray
    instances: np.ndarray
    legend_textures: np.ndarray


def generate_legend_seg(
    layout: LegendLayout,
    bank_images: np.ndarray,
    rng: np.random.Generator,
    blob_count: tuple[int, int] = (2, 5),
) -> LegendSegArrays:
    """Draw one legend_seg image.

    Args:
        layout: the image geometry.
        bank_images: ``render_bank(layout.height, layout.width)``, float32 ``(K, H, W, 3)``.
        rng: the image's own generator.
        blob_count: inclusive range of blobs attempted; a blob that finds no free room after
            ``BLOB_ATTEMPTS`` tries is dropped (measured at 64x64: 3% of the images drawn
            with 5 blobs and 0.3% of those drawn with 4 lose one).
    """
    H, W, C = layout.height, layout.width, layout.num_classes
    legend_textures = rng.choice(len(bank_images), size=C, replace=False).astype(np.int64)
    texture_map = np.full((H, W), -1, dtype=np.int64)
    for k, (y0, y1, x0, x1) in enumerate(layout.patch_boxes):
        texture_map[y0:y1, x0:x1] = legend_textures[k]
    mask = np.zeros((H, W), dtype=np.int64)
    mask[: layout.legend_height] = IGNORE_INDEX
    instances = np.zeros((H, W), dtype=np.int64)
    classes = _place_blobs(layout, rng, instances, int(rng.integers(*blob_count, endpoint=True)))
    for blob, cls in enumerate(classes, start=1):
        inside = instances == blob
        texture_map[inside] = legend_textures[cls]
        mask[inside] = cls + 1
    return LegendSegArrays(
        _compose_image(layout, bank_images, texture_map), mask, instances, legend_textures
    )


def _place_blobs(
    layout: LegendLayout, rng: np.random.Generator, instances: np.ndarray, count: int
) -> list[int]:
    """Rasterise up to ``count`` blobs into ``instances`` (in place); return their classes 0..C-1.

    Blobs keep at least one background pixel between each other and stay inside the field.
    Each blob gets ``BLOB_ATTEMPTS`` tries; the largest radius allowed shrinks linearly to the
    smallest over them, so that a crowded field still finds room for a small blob.
    """
    top, H, W = layout.legend_height, layout.height, layout.width
    ys, xs = np.mgrid[top:H, 0:W]
    field = instances[top:]
    blocked = np.zeros(field.shape, dtype=bool)
    r_low, r_high = layout.blob_radius_range
    classes: list[int] = []
    for _ in range(count):
        for attempt in range(BLOB_ATTEMPTS):
            shrink = attempt / (BLOB_ATTEMPTS - 1)
            radius = rng.uniform(r_low, r_high - shrink * (r_high - r_low))
            center = (
                rng.uniform(top + radius, H - 1 - radius),
                rng.uniform(radius, W - 1 - radius),
            )
            box = _disc_box(center[0] - top, center[1], radius + 1, field.shape)
            shape = random_blob_mask(rng, ys[box], xs[box], center, radius)
            if shape.sum() >= r_low**2 and not (shape & blocked[box]).any():
                classes.append(int(rng.integers(layout.num_classes)))
                field[box][shape] = len(classes)
                blocked[box] |= _dilate(shape)
                break
    return classes


def _disc_box(cy: float, cx: float, radius: float, shape: tuple[int, ...]) -> tuple[slice, slice]:
    """Row and column slices covering the disc ``((cy, cx), radius)``, clipped to ``shape``."""
    return (
        slice(max(0, int(np.floor(cy - radius))), min(shape[0], int(np.ceil(cy + radius)) + 1)),
        slice(max(0, int(np.floor(cx - radius))), min(shape[1], int(np.ceil(cx + radius)) + 1)),
    )


def _dilate(shape: np.ndarray) -> np.ndarray:
    """``shape`` grown by one pixel in the 8-neighbourhood (boolean ``(h, w)``)."""
    padded = np.pad(shape, 1)
    h, w = shape.shape
    grown = np.zeros_like(shape)
    for dy in range(3):
        for dx in range(3):
            grown |= padded[dy : dy + h, dx : dx + w]
    return grown


def _compose_image(
    layout: LegendLayout, bank_images: np.ndarray, texture_map: np.ndarray
) -> np.ndarray:
    """Paint textures where ``texture_map >= 0`` over the frame / field background colours."""
    H, W = texture_map.shape
    image = np.empty((H, W, 3), dtype=np.float32)
    image[: layout.legend_height] = LEGEND_FRAME
    image[layout.legend_height :] = FIELD_BACKGROUND
    painted = texture_map >= 0
    ys, xs = np.nonzero(painted)
    image[ys, xs] = bank_images[texture_map[ys, xs], ys, xs]
    return image
