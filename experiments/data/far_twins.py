"""Far twins: 32x32 canvases holding two *different* 8x8 digits of the same class, far apart.

The digits are scikit-learn's bundled 8x8 digits at their native resolution (no download, no
resampling), both at rows 8..15; the left digit in columns 0..7, the right one in columns
24..31: each fills one cell of the 4 x 4 grid of 8 x 8 cells the generation networks work on,
three cells apart. A window that holds a pixel of both digits spans columns 7..24, 18 columns
(``OFFSET - DIGIT + 2``): a network whose receptive field is narrower cannot see both digits at
once, so keeping the two classes equal needs a global path (the generation experiment's context
block, ``docs/generation.md``).

Each half of the canvas (columns 0..15, 16..31) holds one whole digit, so the metrics'
half-canvas classifier (``experiments.models.digit_classifier``) reads them as (1, 32, 16)
halves: the left digit at column 0 of its half, the right one at column 8 of its half.

Pixels are in [0, 1]. The digits are split by class (stratified,
``experiments.data.digits.split_indices``) before pairing, so the "train" and "val" canvases
share no digit image.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from experiments.data.twin_digits import TwinDigitsDataset

CANVAS = 32
DIGIT = 8
TOP = 8
LEFT = 0
RIGHT = 24
OFFSET = RIGHT - LEFT
HALF = CANVAS // 2
COLUMNS_IN_HALF = (LEFT, RIGHT - HALF)  # where each digit starts inside its half


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


def far_half_canvases(digits: Tensor, column: int) -> Tensor:
    """(N, 8, 8) digits -> half canvases (N, 1, 32, 16) with the digit at rows 8..15 and
    columns ``column``..``column + 7`` (the classifier's training images)."""
    if not 0 <= column <= HALF - DIGIT:
        raise ValueError(f"far_half_canvases: column must lie in [0, {HALF - DIGIT}], got {column}")
    out = digits.new_zeros(digits.shape[0], 1, CANVAS, HALF)
    out[:, 0, TOP : TOP + DIGIT, column : column + DIGIT] = digits
    return out


class FarTwinsDataset(TwinDigitsDataset):
    """Far-twin canvases: items ``(canvas, label)``, canvas float32 (1, 32, 32) in [0, 1].

    Args:
        split: "train" or "val" (the digit images are split first; module docstring).
        size: number of canvases (pairs drawn with replacement of pairs, never of a pair's two
            items).
        val_fraction: share of each class's digits held out for "val", in (0, 1).
        seed: fixes the digit split and the pairing (a non-negative integer).
    """

    @staticmethod
    def prepare_digits(images: np.ndarray) -> Tensor:
        """(N, 8, 8) scans -> (N, 8, 8) float digits at their native resolution."""
        return digit_tensor(images)

    @staticmethod
    def compose(left: Tensor, right: Tensor) -> Tensor:
        """Two digit batches -> far-twin canvases (N, 1, 32, 32)."""
        return compose_far_canvases(left, right)


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
