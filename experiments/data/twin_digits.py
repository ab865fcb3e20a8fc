"""Twin digits: 32x32 canvases holding two *different* samples of the same digit class side by
side, from scikit-learn's bundled 8x8 digits (no download).

Each 8x8 digit is upsampled to 16x16 (bilinear) and placed in one half of the canvas, vertically
centred: the left digit in columns 0..15, the right one in columns 16..31, rows 8..23. A
generator must keep the two halves consistent (the same class), a constraint between pixels 16
columns apart: the global-context role of the paper's generation experiment.

Pixels are in [0, 1]; ``to_gan_range`` maps them to [-1, 1]. The digits are split by class
(stratified, ``experiments.data.digits.split_indices``) before pairing, so the "train" and "val"
canvases share no digit image.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import Dataset

from experiments.data.digits import NUM_CLASSES, SPLITS, load_digits_arrays, split_indices
from implicit_ham.plugins import check_choice, check_positive_int

CANVAS = 32
DIGIT = 16
TOP = (CANVAS - DIGIT) // 2


def upsample_digits(images: np.ndarray) -> Tensor:
    """(N, 8, 8) in [0, 1] -> (N, 16, 16) float32 in [0, 1], bilinear."""
    x = torch.from_numpy(np.asarray(images, dtype=np.float32)).unsqueeze(1)
    up = F.interpolate(x, size=(DIGIT, DIGIT), mode="bilinear", align_corners=False)
    return up.squeeze(1).clamp_(0.0, 1.0)


def compose_canvases(left: Tensor, right: Tensor) -> Tensor:
    """Two (N, 16, 16) digit stacks -> canvases (N, 1, 32, 32), ``left`` in the left half."""
    if left.shape != right.shape or left.shape[1:] != (DIGIT, DIGIT):
        raise ValueError(
            f"compose_canvases: both stacks must be (N, {DIGIT}, {DIGIT}), got "
            f"{tuple(left.shape)} and {tuple(right.shape)}"
        )
    canvas = left.new_zeros(left.shape[0], 1, CANVAS, CANVAS)
    canvas[:, 0, TOP : TOP + DIGIT, :DIGIT] = left
    canvas[:, 0, TOP : TOP + DIGIT, DIGIT:] = right
    return canvas


def halves(canvases: Tensor) -> tuple[Tensor, Tensor]:
    """Canvases (N, 1, 32, 32) -> (left, right) halves, each (N, 1, 32, 16)."""
    return canvases[..., :DIGIT], canvases[..., DIGIT:]


def pair_indices(labels: np.ndarray, count: int, seed: int) -> np.ndarray:
    """``count`` pairs (count, 2) of indices into ``labels``: each pair two *different* items of
    one class; classes drawn uniformly, items uniformly within the class (seeded)."""
    rng = np.random.default_rng(seed)
    members = [np.flatnonzero(labels == c) for c in range(NUM_CLASSES)]
    small = [c for c, m in enumerate(members) if len(m) < 2]
    if small:
        raise ValueError(f"pair_indices: classes {small} have fewer than two items to pair")
    classes = rng.integers(0, NUM_CLASSES, size=count)
    pairs = np.empty((count, 2), dtype=np.int64)
    for i, c in enumerate(classes):
        pairs[i] = rng.choice(members[c], size=2, replace=False)
    return pairs


def to_gan_range(x: Tensor) -> Tensor:
    """[0, 1] -> [-1, 1]."""
    return x * 2.0 - 1.0


def from_gan_range(x: Tensor) -> Tensor:
    """[-1, 1] -> [0, 1] (clamped)."""
    return ((x + 1.0) / 2.0).clamp(0.0, 1.0)


class TwinDigitsDataset(Dataset[tuple[Tensor, int]]):
    """Twin-digit canvases: items ``(canvas, label)``, canvas float32 (1, 32, 32) in [0, 1].

    Args:
        split: "train" or "val" (the digit images are split first; see the module docstring).
        size: number of canvases (pairs drawn with replacement of pairs, never of a pair's two
            items).
        val_fraction: share of each class's digits held out for "val", in (0, 1).
        seed: fixes the digit split and the pairing (a non-negative integer).
    """

    def __init__(
        self, split: str = "train", size: int = 4096, val_fraction: float = 0.2, seed: int = 0
    ) -> None:
        owner = type(self).__name__
        check_choice(owner, "split", split, SPLITS)
        check_positive_int(owner, "size", size)
        check_positive_int(owner, "seed", seed, minimum=0)
        if not 0 < val_fraction < 1:
            raise ValueError(f"{owner}: val_fraction must lie in (0, 1), got {val_fraction!r}")
        images, labels = load_digits_arrays()
        chosen = split_indices(labels, val_fraction, seed)[split]
        digits, digit_labels = self.prepare_digits(images[chosen]), labels[chosen]
        offset = 0 if split == "train" else 1  # different pairings for the two splits
        self.pairs = pair_indices(digit_labels, size, seed * 2 + offset)
        self.digit_indices = chosen  # into the 1797 original images
        left, right = digits[self.pairs[:, 0]], digits[self.pairs[:, 1]]
        self.canvases = self.compose(left, right)
        self.labels = torch.from_numpy(digit_labels[self.pairs[:, 0]])
        self.split, self.seed = split, seed

    def __len__(self) -> int:
        return int(self.canvases.shape[0])

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        return self.canvases[index], int(self.labels[index])

    @staticmethod
    def prepare_digits(images: np.ndarray) -> Tensor:
        """(N, 8, 8) scans -> the digits the canvases are built from (here upsampled 2x)."""
        return upsample_digits(images)

    @staticmethod
    def compose(left: Tensor, right: Tensor) -> Tensor:
        """Two digit batches -> the canvases (N, 1, 32, 32)."""
        return compose_canvases(left, right)

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"{name}(split={self.split!r}, size={len(self)}, seed={self.seed})"
