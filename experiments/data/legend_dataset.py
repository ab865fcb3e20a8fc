"""``LegendSegDataset``: the legend_seg images as a deterministic torch Dataset."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from experiments.data.legend_seg import IGNORE_INDEX, LegendLayout, generate_legend_seg
from experiments.data.textures import render_bank
from implicit_ham.plugins import check_choice, check_positive_int

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class LegendSegSample:
    """One legend_seg item with everything a test or a plot may need.

    Attributes:
        image: float32 ``(3, H, W)`` in [0, 1].
        mask: int64 ``(H, W)``: 0 background, 1..C blob classes, 255 (ignore) on the legend strip.
        instances: int64 ``(H, W)``: 0 outside blobs, b on the pixels of blob b (1-based).
        legend_textures: bank index of the texture of legend patch k, for k = 0..C-1.
    """

    image: Tensor
    mask: Tensor
    instances: Tensor
    legend_textures: tuple[int, ...]

    @property
    def blob_mask(self) -> Tensor:
        """Boolean ``(H, W)``: the blob pixels, where "blob accuracy" is measured."""
        return blob_mask(self.mask)


def blob_mask(mask: Tensor, ignore_index: int = IGNORE_INDEX) -> Tensor:
    """Boolean mask of blob pixels (label >= 1, not ``ignore_index``); shape of ``mask``."""
    return (mask > 0) & (mask != ignore_index)


class LegendSegDataset(Dataset[tuple[Tensor, Tensor]]):
    """Procedural legend_seg segmentation images (see ``legend_seg.py`` for what they show).

    Item ``i`` is drawn from ``np.random.default_rng([seed, split_id, i])``: the same arguments
    give identical tensors on every call, in any order, and the splits are separate streams.

    Args:
        size: number of images.
        image_size: side of the square image, or ``(height, width)``.
        num_classes: C, blob classes (labels 1..C); a model needs C + 1 outputs (0 = background).
        seed: a non-negative integer.
        split: one of ``SPLITS``; each split is its own random stream.
        legend_height: rows of the legend strip; default a fifth of the height (at least 10).
        blob_count: inclusive range of blobs per image.

    Items are ``(image, mask)``: float32 ``(3, H, W)`` in [0, 1] and int64 ``(H, W)`` with 255 on
    the legend strip (``ignore_index``).
    """

    ignore_index = IGNORE_INDEX

    def __init__(
        self,
        size: int,
        image_size: int | tuple[int, int] = 64,
        num_classes: int = 4,
        seed: int = 0,
        split: str = "train",
        legend_height: int | None = None,
        blob_count: tuple[int, int] = (2, 5),
    ) -> None:
        owner = "LegendSegDataset"
        check_positive_int(owner, "size", size)
        check_positive_int(owner, "seed", seed, minimum=0)
        check_choice(owner, "split", split, SPLITS)
        low, high = blob_count
        if not 1 <= low <= high:
            raise ValueError(
                f"{owner}: blob_count must be (low, high) with 1 <= low <= high, got {blob_count!r}"
            )
        height, width = (image_size, image_size) if isinstance(image_size, int) else image_size
        if legend_height is None:
            self.layout = LegendLayout.default(height, width, num_classes)
        else:
            self.layout = LegendLayout(height, width, num_classes, legend_height)
        self.size = size
        self.seed = seed
        self.split = split
        self.blob_count = (low, high)
        self._bank_images = render_bank(height, width)

    @property
    def num_classes(self) -> int:
        """C, the number of blob classes (labels 1..C)."""
        return self.layout.num_classes

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        sample = self.sample(index)
        return sample.image, sample.mask

    def sample(self, index: int) -> LegendSegSample:
        """Item ``index`` with its blob instances and legend textures."""
        if not -self.size <= index < self.size:
            raise IndexError(
                f"index {index} out of range for a LegendSegDataset of size {self.size}"
            )
        index %= self.size
        rng = np.random.default_rng([self.seed, SPLITS.index(self.split), index])
        arrays = generate_legend_seg(self.layout, self._bank_images, rng, self.blob_count)
        return LegendSegSample(
            image=torch.from_numpy(np.ascontiguousarray(arrays.image.transpose(2, 0, 1))),
            mask=torch.from_numpy(arrays.mask),
            instances=torch.from_numpy(arrays.instances),
            legend_textures=tuple(int(t) for t in arrays.legend_textures),
        )

    def materialize(self) -> tuple[Tensor, Tensor]:
        """All items stacked: images ``(N, 3, H, W)`` float32 and masks ``(N, H, W)`` int64.

        Generating once and training from the stacked tensors (e.g. a ``TensorDataset``) avoids
        re-drawing every image each epoch.
        """
        items = [self[i] for i in range(self.size)]
        return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])

    def __repr__(self) -> str:
        layout = self.layout
        return (
            f"{type(self).__name__}(size={self.size}, image_size=({layout.height}, "
            f"{layout.width}), num_classes={layout.num_classes}, seed={self.seed}, "
            f"split={self.split!r})"
        )
