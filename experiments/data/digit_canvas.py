"""digit_seg: segmentation in the Hamburger paper's regime, built from scikit-learn's real digits.

Each 64x64 canvas is a 4x4 grid of 16x16 cells; ``digits_per_image`` cells hold a real 8x8
digit scan upsampled 2x, the others are background. All digits of one image are drawn from
``classes_per_image`` classes (1 or 2, chosen per image), so the image's other digits tell which
classes are present: *context helps*, as in natural scenes. Every digit is partly occluded (a
random rectangle replaced by uniform noise) and the whole canvas gets Gaussian noise, so a
classifier that sees one digit alone is often wrong. Every pixel is labelled: 0 for
background, ``1 + digit`` for every pixel of a digit's cell (11 classes, no ignored pixels).

Unlike legend_seg (where a pixel's own features carry no class and the class must be read off
unlabelled legend pixels), here each digit's own pixels carry its class, noisily: the regime in
which the paper's one-step gradient was shown to work (pretrained per-pixel features, context as
low-rank denoising). Canvases of the "train" split use only the digits of the stratified train
split (``digits.split_indices``), "val" only the held-out ones. With a ``scan_seed`` the scans
are split three ways instead (``scan_split``: train / val / test, disjoint, stratified by class,
chosen by that seed): the independent replicates of the paper-regime study each draw their own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from experiments.data.digits import NUM_CLASSES, load_digits_arrays, split_indices, stratified_split
from implicit_ham.plugins import check_choice, check_positive_int

CANVAS = 64
CELL = 16
GRID = CANVAS // CELL
UPSAMPLE = CELL // 8
SPLITS = ("train", "val", "test")
SEG_CLASSES = NUM_CLASSES + 1  # background + ten digits


@dataclass(frozen=True)
class CanvasStyle:
    """How hard a canvas is.

    Attributes:
        digits_per_image: digits per canvas (1..16 cells).
        max_classes: each canvas draws 1..max_classes distinct classes for its digits.
        occlusion: (min, max) side of the noise rectangle over each digit, in pixels of its
            16x16 cell (0, 0: no occlusion).
        noise: standard deviation of the Gaussian noise added to the canvas (then clipped to
            [0, 1]).
    """

    digits_per_image: int = 5
    max_classes: int = 2
    occlusion: tuple[int, int] = (8, 12)
    noise: float = 0.35

    def __post_init__(self) -> None:
        owner = "CanvasStyle"
        check_positive_int(owner, "digits_per_image", self.digits_per_image)
        if self.digits_per_image > GRID * GRID:
            raise ValueError(
                f"{owner}: digits_per_image={self.digits_per_image} exceeds the "
                f"{GRID * GRID} cells of a canvas; use at most {GRID * GRID}"
            )
        check_positive_int(owner, "max_classes", self.max_classes)
        low, high = self.occlusion
        if not 0 <= low <= high <= CELL:
            raise ValueError(
                f"{owner}: occlusion={self.occlusion!r} must be (min, max) with "
                f"0 <= min <= max <= {CELL}, e.g. (8, 12)"
            )
        if not self.noise >= 0:
            raise ValueError(f"{owner}: noise must be >= 0, got {self.noise!r}")


CLEAN = CanvasStyle(occlusion=(0, 0), noise=0.0, max_classes=NUM_CLASSES)

# Share of each class's scans in val and in test under a ``scan_seed`` (the rest is train).
HELD_OUT_FRACTION = 0.2


def scan_split(labels: np.ndarray, scan_seed: int | None) -> dict[str, np.ndarray]:
    """Sorted scan indices per split. ``scan_seed=None``: the fixed 80/20 train / val split of
    ``DigitsDataset`` (seed 0), no test scans. An integer: within each class a permutation by
    ``scan_seed`` sends ``round(0.2 n_c)`` scans to val, as many to test and the rest to train,
    so the three sets are disjoint and each replicate of a study draws its own."""
    if scan_seed is None:
        fixed = split_indices(labels, HELD_OUT_FRACTION, 0)
        return {**fixed, "test": np.zeros(0, dtype=np.int64)}
    check_positive_int("scan_split", "scan_seed", scan_seed, minimum=0)
    rng = np.random.default_rng([scan_seed, 7])
    return stratified_split(labels, HELD_OUT_FRACTION, rng, ("val", "test"))


def digit_canvases(
    size: int,
    split: str = "train",
    style: CanvasStyle = CanvasStyle(),
    seed: int = 0,
    scan_seed: int | None = None,
) -> tuple[Tensor, Tensor]:
    """``size`` canvases: images float32 (size, 1, 64, 64) in [0, 1], masks int64 (size, 64, 64).

    Deterministic in (size, split, style, seed, scan_seed); the scans of ``split`` are those of
    ``scan_split(labels, scan_seed)`` (None: the stratified 80/20 train / val split of
    ``DigitsDataset``, seed 0, which has no "test"), so no held-out digit appears in a train
    canvas. The layout (cells, classes, scans) and the degradation (occlusion, noise) use
    separate random streams, so canvases of different styles share their layout and masks.
    """
    check_positive_int("digit_canvases", "size", size)
    check_choice("digit_canvases", "split", split, SPLITS)
    check_positive_int("digit_canvases", "seed", seed, minimum=0)
    if split == "test" and scan_seed is None:
        raise ValueError(
            "digit_canvases: split='test' needs a scan_seed (the fixed split without one has "
            "train and val scans only); pass scan_seed=<the replicate's data seed>"
        )
    images, labels = load_digits_arrays()
    members = scan_split(labels, scan_seed)[split]
    by_class = [members[labels[members] == c] for c in range(NUM_CLASSES)]
    layout = np.random.default_rng([seed, SPLITS.index(split)])
    degrade = np.random.default_rng([seed, SPLITS.index(split), 1])
    canvases = np.zeros((size, CANVAS, CANVAS), dtype=np.float32)
    masks = np.zeros((size, CANVAS, CANVAS), dtype=np.int64)
    for i in range(size):
        _draw(canvases[i], masks[i], images, by_class, style, layout, degrade)
    if style.noise > 0:
        canvases += degrade.normal(0.0, style.noise, canvases.shape).astype(np.float32)
    np.clip(canvases, 0.0, 1.0, out=canvases)
    return torch.from_numpy(canvases).unsqueeze(1), torch.from_numpy(masks)


def _draw(
    canvas: np.ndarray,
    mask: np.ndarray,
    images: np.ndarray,
    by_class: list[np.ndarray],
    style: CanvasStyle,
    rng: np.random.Generator,
    degrade: np.random.Generator,
) -> None:
    """Paint one canvas (64, 64) and its mask in place (layout from ``rng``, occlusions from
    ``degrade``)."""
    n_classes = int(rng.integers(1, style.max_classes + 1))
    classes = rng.choice(NUM_CLASSES, size=n_classes, replace=False)
    cells = rng.choice(GRID * GRID, size=style.digits_per_image, replace=False)
    for k, cell in enumerate(cells):
        digit = int(classes[k % n_classes]) if k < n_classes else int(rng.choice(classes))
        scan = images[int(rng.choice(by_class[digit]))]
        patch = np.kron(scan, np.ones((UPSAMPLE, UPSAMPLE), dtype=np.float32))
        low, high = style.occlusion
        if high > 0:
            h, w = (int(v) for v in degrade.integers(low, high + 1, size=2))
            top, left = (int(v) for v in degrade.integers(0, CELL - np.array([h, w]) + 1))
            patch[top : top + h, left : left + w] = degrade.random((h, w), dtype=np.float32)
        row, col = divmod(int(cell), GRID)
        block = np.s_[row * CELL : (row + 1) * CELL, col * CELL : (col + 1) * CELL]
        canvas[block] = patch
        mask[block] = 1 + digit
