"""digit_seg canvases: real digit scans where the mask says, 1..max_classes classes per image,
occlusion and noise as configured, disjoint train/val digits, every pixel labelled."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from experiments.data.digit_canvas import CELL, CLEAN, GRID, CanvasStyle, digit_canvases
from experiments.data.digits import split_indices
from experiments.data.splits import digit_seg


@pytest.fixture(scope="module")
def scans() -> tuple[np.ndarray, np.ndarray]:
    bunch = load_digits()
    return (bunch.images / 16.0).astype(np.float32), bunch.target


def _cells(mask: torch.Tensor) -> dict[tuple[int, int], int]:
    """{(row, col): label} of the non-background cells; asserts each cell is one label."""
    out = {}
    for row in range(GRID):
        for col in range(GRID):
            block = mask[row * CELL : (row + 1) * CELL, col * CELL : (col + 1) * CELL]
            assert block.unique().numel() == 1, "a cell mixes labels"
            if int(block[0, 0]):
                out[(row, col)] = int(block[0, 0])
    return out


def test_clean_canvas_cells_are_upsampled_scans_of_the_labelled_class(scans) -> None:
    images, targets = scans
    upsampled = {
        i: np.kron(images[i], np.ones((2, 2), np.float32))
        for i in split_indices(targets, 0.2, 0)["val"]
    }
    canvases, masks = digit_canvases(6, "val", CLEAN, seed=3)
    for canvas, mask in zip(canvases, masks, strict=False):
        cells = _cells(mask)
        assert len(cells) == CLEAN.digits_per_image
        for (row, col), label in cells.items():
            patch = canvas[0, row * CELL : (row + 1) * CELL, col * CELL : (col + 1) * CELL].numpy()
            # an independent search: some held-out scan of that class, upsampled, is this patch
            assert any(
                targets[i] == label - 1 and np.array_equal(patch, up) for i, up in upsampled.items()
            )
        background = mask == 0
        assert float(canvas[0][background].abs().max()) == 0.0


def test_each_image_draws_its_digits_from_one_or_two_classes() -> None:
    _, masks = digit_canvases(200, "train", CanvasStyle(), seed=0)
    counts = [len(set(_cells(mask).values())) for mask in masks]
    assert set(counts) == {1, 2}


def test_occlusion_and_noise_change_the_pixels_and_stay_in_range() -> None:
    clean, clean_masks = digit_canvases(20, "train", CanvasStyle(noise=0.0, occlusion=(0, 0)))
    hard, hard_masks = digit_canvases(20, "train", CanvasStyle(noise=0.2, occlusion=(4, 8)))
    assert torch.equal(clean_masks, hard_masks)  # same layout: the style only degrades pixels
    assert float(hard.min()) >= 0.0 and float(hard.max()) <= 1.0
    # noise sigma 0.2 clipped to [0, 1]: the background's mean rises to E[max(0, N(0, .2))] = .08
    background = hard[:, 0][hard_masks == 0]
    assert abs(float(background.mean()) - 0.2 / np.sqrt(2 * np.pi)) < 0.005
    occluded = CanvasStyle(noise=0.0, occlusion=(8, 8))
    only_occluded, _ = digit_canvases(20, "train", occluded)
    changed = (only_occluded != clean).flatten(1).sum(1)
    # an 8x8 rectangle of uniform noise per digit: at most 64 pixels per digit change
    assert int(changed.max()) <= 64 * CanvasStyle().digits_per_image and int(changed.min()) > 0


def test_splits_are_deterministic_and_seeded() -> None:
    first, second = digit_seg(train_size=8, val_size=4), digit_seg(train_size=8, val_size=4)
    assert torch.equal(first.train.tensors[0], second.train.tensors[0])
    assert first.task.num_classes == 11 and first.task.ignore_index is None
    assert first.val.tensors[0].shape == (4, 1, 64, 64)
    assert not torch.equal(digit_seg(seed=1, train_size=8).train.tensors[0],
                           first.train.tensors[0])  # fmt: skip


@pytest.mark.parametrize(
    ("option", "value", "fix"),
    [
        ("digits_per_image", 17, "at most 16"),
        ("occlusion", (9, 4), "min <= max"),
        ("noise", -0.1, ">= 0"),
    ],
)
def test_bad_style_is_refused_with_the_fix(option: str, value: object, fix: str) -> None:
    with pytest.raises(ValueError, match=fix):
        CanvasStyle(**{option: value})  # type: ignore[arg-type]
