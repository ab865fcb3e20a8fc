"""Does the discriminator judge the constraint? Its logits on real canvases whose two digits
agree vs on real canvases whose two digits disagree.

The mismatched canvases take the left half of real canvas i and the right half of real canvas
j (a cyclic shift of the batch, pairs of equal class dropped): every digit is real, only the
pairing breaks the rule. A discriminator that reads the other digit through its context block
scores the digit cells of the mismatched canvases lower; without a context path no logit can
tell them apart (the gap, paired cell by cell, is then exactly 0).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from experiments.data.far_twins import LEFT, RIGHT, TOP
from experiments.generation.nets import CANVAS, CELL

HALF = CANVAS // 2


def _pairing(labels: Tensor) -> tuple[Tensor, Tensor]:
    """The recombination's partner of each canvas ((i + 1) mod N) and whether the two classes
    differ (the canvases kept), both (N,)."""
    shift = torch.roll(torch.arange(len(labels)), -1)
    return shift, labels != labels[shift]


def mismatched(canvases: Tensor, labels: Tensor) -> Tensor:
    """Real canvases (N, 1, 32, 32) with class labels (N,) -> canvases (M, 1, 32, 32), M <= N,
    whose left digit is canvas i's and right digit canvas (i + 1) mod N's, for the i where the
    two classes differ."""
    if canvases.shape[0] != labels.shape[0] or canvases.shape[0] < 2:
        raise ValueError(
            f"mismatched: need >= 2 canvases and one label each, got {canvases.shape[0]} "
            f"canvases and {labels.shape[0]} labels"
        )
    shift, keep = _pairing(labels)
    out = canvases[keep].clone()
    out[..., HALF:] = canvases[shift[keep]][..., HALF:]
    return out


def digit_cells(logits: Tensor) -> tuple[Tensor, Tensor]:
    """Per-cell logits (N, 4, 4) -> the left and the right digit cell's logits, (N,) each."""
    row = TOP // CELL
    return logits[:, row, LEFT // CELL], logits[:, row, RIGHT // CELL]


def pair_logits(discriminator: nn.Module, canvases: Tensor) -> Tensor:
    """Canvases (N, 1, 32, 32) in [0, 1] -> the mean of their two digit cells' logits (N,), the
    discriminator fed the GAN's range [-1, 1]."""
    left, right = digit_cells(discriminator(canvases * 2 - 1))
    return (left + right) / 2


@torch.no_grad()
def mismatch_gap(discriminator: nn.Module, canvases: Tensor, labels: Tensor) -> float:
    """How much lower the discriminator scores disagreeing digits, paired cell by cell.

    For each recombined canvas (left digit of real canvas i, right digit of real canvas
    j = i + 1, classes differ: ``mismatched``) the mean of its two digit cells' logits is
    compared with the same cells' logits in the real canvases they came from (cell left of i,
    cell right of j). A discriminator whose logits depend on their own cell alone gives 0
    exactly; > 0 means disagreeing digits are penalised.

    Args:
        discriminator: images (N, 1, 32, 32) in [-1, 1] -> per-cell logits (N, 4, 4).
        canvases: real canvases (N, 1, 32, 32) in [0, 1]. labels: their classes (N,).
    """
    was_training = discriminator.training
    discriminator.eval()
    try:
        left, right = digit_cells(discriminator(canvases * 2 - 1))  # the GAN's range
        shift, keep = _pairing(labels)
        agree = (left[keep] + right[shift[keep]]) / 2
        disagree = pair_logits(discriminator, mismatched(canvases, labels))
    finally:
        discriminator.train(was_training)
    return float((agree - disagree).mean())
