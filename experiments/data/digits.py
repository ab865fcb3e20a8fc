"""scikit-learn's bundled 8x8 handwritten digits (1797 images, 10 classes) as a small real dataset.

The images ship inside scikit-learn, so nothing is downloaded. Pixel values 0..16 are scaled to
[0, 1]. The train/val split is stratified by class and fixed by ``seed``.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from implicit_ham.plugins import check_choice, check_positive_int

SPLITS = ("train", "val")
NUM_CLASSES = 10
MAX_PIXEL = 16.0


@functools.cache
def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """All digits: float32 images ``(1797, 8, 8)`` in [0, 1] and int64 labels ``(1797,)``,
    read once per process and returned read-only (index them to get writable copies)."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as error:
        raise ImportError(
            "the digits dataset needs scikit-learn, which is not installed; "
            "install it with `pip install scikit-learn`"
        ) from error
    bunch = load_digits()
    images = (np.asarray(bunch.images, dtype=np.float32) / MAX_PIXEL).astype(np.float32)
    labels = np.asarray(bunch.target, dtype=np.int64)
    images.setflags(write=False)
    labels.setflags(write=False)
    return images, labels


def split_indices(labels: np.ndarray, val_fraction: float, seed: int) -> dict[str, np.ndarray]:
    """Stratified split: within each class, a seeded shuffle sends ``round(val_fraction * n_c)``
    items to "val" and the rest to "train". Returns sorted index arrays per split.
    """
    return stratified_split(labels, val_fraction, np.random.default_rng(seed), ("val",))


def stratified_split(
    labels: np.ndarray, fraction: float, rng: np.random.Generator, held_out: tuple[str, ...]
) -> dict[str, np.ndarray]:
    """Within each class, a shuffle by ``rng`` sends ``round(fraction * n_c)`` items to each
    split of ``held_out`` in turn and the rest to "train". Returns sorted index arrays per
    split, "train" first."""
    parts: dict[str, list[np.ndarray]] = {name: [] for name in ("train", *held_out)}
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        held = round(fraction * len(members))
        for i, name in enumerate(held_out):
            parts[name].append(members[i * held : (i + 1) * held])
        parts["train"].append(members[len(held_out) * held :])
    return {name: np.sort(np.concatenate(chunks)) for name, chunks in parts.items()}


class DigitsDataset(Dataset[tuple[Tensor, int]]):
    """8x8 digits: items are ``(image, label)``, image float32 ``(1, 8, 8)`` in [0, 1].

    Args:
        split: "train" or "val".
        val_fraction: share of each class held out for "val", in (0, 1).
        seed: a non-negative integer fixing the split.
    """

    def __init__(self, split: str = "train", val_fraction: float = 0.2, seed: int = 0) -> None:
        owner = "DigitsDataset"
        check_choice(owner, "split", split, SPLITS)
        check_positive_int(owner, "seed", seed, minimum=0)
        if not 0 < val_fraction < 1:
            raise ValueError(f"{owner}: val_fraction must lie in (0, 1), got {val_fraction!r}")
        images, labels = load_digits_arrays()
        self.indices = split_indices(labels, val_fraction, seed)[split]
        self.images = torch.from_numpy(images[self.indices]).unsqueeze(1)
        self.labels = torch.from_numpy(labels[self.indices])
        self.split = split
        self.seed = seed

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        return self.images[index], int(self.labels[index])

    def __repr__(self) -> str:
        return f"DigitsDataset(split={self.split!r}, size={len(self)}, seed={self.seed})"
