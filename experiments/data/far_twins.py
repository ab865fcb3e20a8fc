"""Far twins: 32x32 canvases holding two *different* 8x8 digits of the same class, far apart.

The digits are scikit-learn's bundled 8x8 digits at their native resolution (no download, no
resampling), both at rows 8..15; the left digit in columns 0..7, the right one in columns
24..31: each fills one cell of the 4 x 4 grid of 8 x 8 cells the generation networks work on,
three cells apart. A window that holds a pixel of both digits spans columns 7..24, 18 columns
(``OFFSET - DIGIT + 2``): a network whose receptive field is narrower cannot see both digits at
once, so keeping the two classes equal needs a global path (the context block of the
generation study's per-cell models, ``docs/generation_v3.md``).

Pixels are in [0, 1]. The digits are split by class (stratified,
``experiments.data.digits.split_indices``) before pairing, so the "train" and "val" canvases
share no digit image.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from experiments.data.digits import NUM_CLASSES, SPLITS, load_digits_arrays, split_indices
from implicit_ham.plugins import check_choice, check_positive_int

CANVAS = 32
DIGIT = 8
TOP = 8
LEFT = 0
RIGHT = 24
OFFSET = RIGHT - LEFT


def digit_tensor(images: np.ndarray) -> Tensor:
    """(N, 8, 8) in [0, 1] -> float32 (N, 8, 8) in [0, 1]."""
    return torch.from_numpy(np.asarray(images, dtype=np.float32)).clamp_(0.0, 1.0)


def compose_far_canvases(left: Tensor, right: Tensor) -> Tensor:
    """Two (N, 8, 8) digit stacks -> canvases (N, 1, 32, 32), ``left`` at columns 0..7,
    ``right`` at columns 24..31, both at rows 8..15."""
    if left.shape != right.shape or left.shape[1:] != (DIGIT, DIGIT):
        raise ValueError(
            f"compose_far_canvases: both stacks must be (N, {DIGIT}, {DIGIT}), got "
            f"{tuple(left.shape)} and {tuple(right.shape)}"
        )
    canvas = left.new_zeros(left.shape[0], 1, CANVAS, CANVAS)
    canvas[:, 0, TOP : TOP + DIGIT, LEFT : LEFT + DIGIT] = left
    canvas[:, 0, TOP : TOP + DIGIT, RIGHT : RIGHT + DIGIT] = right
    return canvas


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


class FarTwinsDataset(Dataset[tuple[Tensor, int]]):
    """Far-twin canvases: items ``(canvas, label)``, canvas float32 (1, 32, 32) in [0, 1], label
    the class of both digits.

    Args:
        split: "train" or "val" (the digit images are split first; module docstring).
        size: number of canvases (pairs drawn with replacement of pairs, never of a pair's two
            items).
        val_fraction: share of each class's digits held out for "val", in (0, 1).
        seed: fixes the digit split and the pairing (a non-negative integer).

    Attributes:
        pairs: (size, 2) indices of each canvas's left and right digit into ``digit_indices``,
            the split's digits as indices into the 1797 scans.
    """

    def __init__(
        self, split: str = "train", size: int = 4096, val_fraction: float = 0.2, seed: int = 0
    ) -> None:
        check_choice("FarTwinsDataset", "split", split, SPLITS)
        check_positive_int("FarTwinsDataset", "size", size)
        check_positive_int("FarTwinsDataset", "seed", seed, minimum=0)
        if not 0 < val_fraction < 1:
            raise ValueError(f"FarTwinsDataset: val_fraction must lie in (0, 1), got "
                             f"{val_fraction!r}")  # fmt: skip
        images, labels = load_digits_arrays()
        chosen = split_indices(labels, val_fraction, seed)[split]
        digits, digit_labels = digit_tensor(images[chosen]), labels[chosen]
        offset = 0 if split == "train" else 1  # different pairings for the two splits
        self.pairs = pair_indices(digit_labels, size, seed * 2 + offset)
        self.digit_indices = chosen
        self.canvases = compose_far_canvases(digits[self.pairs[:, 0]], digits[self.pairs[:, 1]])
        self.labels = torch.from_numpy(digit_labels[self.pairs[:, 0]])
        self.split, self.seed = split, seed

    def __len__(self) -> int:
        return int(self.canvases.shape[0])

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        return self.canvases[index], int(self.labels[index])

    def __repr__(self) -> str:
        return f"FarTwinsDataset(split={self.split!r}, size={len(self)}, seed={self.seed})"


def mask_right_cell(canvases: Tensor) -> Tensor:
    """Canvases (N, 1, 32, 32) -> copies with the right digit's cell (rows 8..15, columns
    24..31) set to 0: the masked-cell model's inputs."""
    masked = canvases.clone()
    masked[..., TOP : TOP + DIGIT, RIGHT : RIGHT + DIGIT] = 0.0
    return masked


def right_cell(canvases: Tensor) -> Tensor:
    """Canvases (N, 1, 32, 32) -> the right digit's cells (N, 8, 8)."""
    return canvases[:, 0, TOP : TOP + DIGIT, RIGHT : RIGHT + DIGIT]


def masked_cell_loss(prediction: Tensor, target: Tensor) -> Tensor:
    """Squared error on the right digit's cell, summed over its 64 pixels, mean over canvases:
    prediction and target (N, 1, 32, 32) -> 0-d loss (the masked-cell task's loss)."""
    if prediction.shape != target.shape:
        raise ValueError(
            f"masked_cell_loss: prediction {tuple(prediction.shape)} and target "
            f"{tuple(target.shape)} must have one shape (N, 1, {CANVAS}, {CANVAS})"
        )
    return (right_cell(prediction) - right_cell(target)).pow(2).sum((1, 2)).mean()


def recombined(canvases: Tensor, labels: Tensor) -> Tensor:
    """Real canvases (N, 1, 32, 32) with their classes (N,) -> canvases (M, 1, 32, 32), M <= N,
    holding the left digit of canvas i and the right digit of canvas (i + 1) mod N, for the i
    whose two classes differ (in order of i): every digit real, only the pairing broken."""
    if canvases.shape[0] != labels.shape[0] or canvases.shape[0] < 2:
        raise ValueError(
            f"recombined: need >= 2 canvases and one label each, got {canvases.shape[0]} "
            f"canvases and {labels.shape[0]} labels"
        )
    partner = torch.roll(torch.arange(len(labels)), -1)
    keep = labels != labels[partner]
    out = canvases[keep].clone()
    out[..., CANVAS // 2 :] = canvases[partner[keep]][..., CANVAS // 2 :]  # right half
    return out


def pairing_canvases(
    split: str, size: int, val_fraction: float = 0.2, seed: int = 0
) -> tuple[Tensor, Tensor]:
    """The pairing check's items: canvases (size, 1, 32, 32) and labels (size,) int64, the first
    half real far-twin canvases (label 1: two different digits of one class), the second half
    their recombinations (label 0: two real digits of different classes, ``recombined``), so the
    set is exactly balanced (its accuracy is its balanced accuracy). Built from
    ``FarTwinsDataset(split, size, val_fraction, seed)``: "train" and "val" use disjoint scans.
    Each canvas alone (the left or the right digit) has the same distribution in both halves:
    only the two digits together tell them apart."""
    if size < 2 or size % 2:
        raise ValueError(f"pairing_canvases: size must be an even number >= 2, got {size!r}")
    real = FarTwinsDataset(split, size, val_fraction=val_fraction, seed=seed)
    fake = recombined(real.canvases, real.labels)
    half = size // 2
    if len(fake) < half:
        raise ValueError(
            f"pairing_canvases: only {len(fake)} of {size} neighbouring canvases differ in class, "
            f"fewer than the {half} recombinations needed; use a larger size"
        )
    canvases = torch.cat([real.canvases[:half], fake[:half]])
    labels = torch.cat([torch.ones(half, dtype=torch.int64), torch.zeros(half, dtype=torch.int64)])
    return canvases, labels
