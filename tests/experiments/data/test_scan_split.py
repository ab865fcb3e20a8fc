"""The three-way scan split of the paper-regime studies (v4, and v3 before it): disjoint by scan,
stratified, and a deterministic function of the replicate's data seed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from experiments.data.digit_canvas import digit_canvases, scan_split
from experiments.data.digits import load_digits_arrays
from experiments.data.splits import digit_seg


def test_scan_split_is_disjoint_complete_and_stratified() -> None:
    _, labels = load_digits_arrays()
    parts = scan_split(labels, 1000)
    train, val, test = (set(parts[name].tolist()) for name in ("train", "val", "test"))
    assert not train & val and not train & test and not val & test
    assert train | val | test == set(range(len(labels)))
    for c in range(10):  # round(0.2 n_c) scans of each class in val and in test
        n_c = int((labels == c).sum())
        assert int((labels[parts["val"]] == c).sum()) == round(0.2 * n_c)
        assert int((labels[parts["test"]] == c).sum()) == round(0.2 * n_c)


def test_scan_split_is_deterministic_per_seed_and_differs_between_seeds() -> None:
    _, labels = load_digits_arrays()
    first, again, other = (
        scan_split(labels, 1000),
        scan_split(labels, 1000),
        scan_split(labels, 1001),
    )
    for name in ("train", "val", "test"):
        np.testing.assert_array_equal(first[name], again[name])
    assert not np.array_equal(first["test"], other["test"])


def test_canvases_are_deterministic_and_the_test_split_needs_a_scan_seed() -> None:
    a = digit_canvases(3, "test", seed=5, scan_seed=1000)
    b = digit_canvases(3, "test", seed=5, scan_seed=1000)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    with pytest.raises(ValueError, match="scan_seed"):
        digit_canvases(3, "test")
    with pytest.raises(ValueError, match="scan_seed"):
        digit_seg(train_size=2, val_size=2, test_size=2)


def test_test_canvases_draw_only_test_scans() -> None:
    """A clean canvas's digit cells are exact upsampled scans: each must be a test scan."""
    from experiments.data.digit_canvas import CELL, CLEAN, GRID, UPSAMPLE

    images, labels = load_digits_arrays()
    parts = scan_split(labels, 1001)
    canvases, masks = digit_canvases(4, "test", CLEAN, seed=3, scan_seed=1001)
    test_scans = images[parts["test"]]
    other = images[np.concatenate([parts["train"], parts["val"]])]
    checked = 0
    for canvas, mask in zip(canvases[:, 0].numpy(), masks.numpy(), strict=True):
        for cell in range(GRID * GRID):
            row, col = divmod(cell, GRID)
            block = np.s_[row * CELL : (row + 1) * CELL, col * CELL : (col + 1) * CELL]
            if mask[block].max() == 0:
                continue
            scan = canvas[block][::UPSAMPLE, ::UPSAMPLE]
            in_test = np.abs(test_scans - scan).reshape(len(test_scans), -1).max(1).min() < 1e-6
            in_other = np.abs(other - scan).reshape(len(other), -1).max(1).min() < 1e-6
            assert in_test and not in_other
            checked += 1
    assert checked >= 4
