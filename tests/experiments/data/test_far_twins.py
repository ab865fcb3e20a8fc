"""Far-twin canvases: two different native 8x8 digits of one class at the documented cells, from
disjoint digit scans in train and val, deterministic by seed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from experiments.data.far_twins import (
    FarTwinsDataset,
    compose_far_canvases,
    pair_indices,
    pairing_canvases,
    recombined,
)


@pytest.fixture(scope="module")
def originals() -> tuple[np.ndarray, np.ndarray]:
    bunch = load_digits()
    return bunch.images / 16.0, bunch.target


def test_a_canvas_holds_two_different_scans_of_its_class_three_cells_apart(originals) -> None:
    images, targets = originals
    ds = FarTwinsDataset("train", size=64, seed=0)
    assert len(ds) == 64 and ds.canvases.shape == (64, 1, 32, 32)
    assert ds.canvases.dtype == torch.float32
    for i in (0, 17, 63):
        a, b = (int(ds.digit_indices[j]) for j in ds.pairs[i])
        assert a != b and targets[a] == targets[b] == ds[i][1]
        canvas = ds[i][0][0].numpy()
        np.testing.assert_allclose(canvas[8:16, 0:8], images[a], atol=1e-6)
        np.testing.assert_allclose(canvas[8:16, 24:32], images[b], atol=1e-6)
        blank = canvas.copy()
        blank[8:16, 0:8] = blank[8:16, 24:32] = 0
        assert not blank.any()


def test_train_and_val_share_no_digit_scan_and_are_deterministic() -> None:
    train, val = FarTwinsDataset("train", 32, seed=1), FarTwinsDataset("val", 32, seed=1)
    assert not set(train.digit_indices) & set(val.digit_indices)
    assert torch.equal(train.canvases, FarTwinsDataset("train", 32, seed=1).canvases)
    assert not torch.equal(train.canvases, FarTwinsDataset("train", 32, seed=2).canvases)


def test_pairs_cover_every_class_and_never_repeat_an_item() -> None:
    labels = np.repeat(np.arange(10), 5)
    pairs = pair_indices(labels, 500, seed=0)
    assert (pairs[:, 0] != pairs[:, 1]).all()
    assert (labels[pairs[:, 0]] == labels[pairs[:, 1]]).all()
    assert set(labels[pairs[:, 0]]) == set(range(10))
    with pytest.raises(ValueError, match="fewer than two"):
        pair_indices(np.array([0, 1, 1]), 4, seed=0)


def test_compose_refuses_digits_of_another_size() -> None:
    with pytest.raises(ValueError, match="8, 8"):
        compose_far_canvases(torch.rand(2, 16, 16), torch.rand(2, 16, 16))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"split": "test"}, "split"), ({"size": 0}, "size"), ({"val_fraction": 1.0}, "val_fraction")],
)
def test_bad_arguments_are_refused_with_their_name(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        FarTwinsDataset(**kwargs)


def _scan_of(cell: np.ndarray, images: np.ndarray) -> int:
    """The index of the one scan (of scikit-learn's 1797) whose pixels ``cell`` holds."""
    found = np.flatnonzero(np.abs(images - cell).reshape(len(images), -1).max(1) < 1e-6)
    assert len(found) >= 1, "a cell holds no scan"
    return int(found[0])


def _scans(canvases: torch.Tensor, images: np.ndarray) -> list[tuple[int, int]]:
    """(left scan, right scan) of each canvas, found by pixel equality with the scans."""
    pixels = canvases[:, 0].numpy()
    return [(_scan_of(c[8:16, 0:8], images), _scan_of(c[8:16, 24:32], images)) for c in pixels]


def test_pairing_labels_say_whether_the_two_scans_share_a_class(originals) -> None:
    images, targets = originals
    canvases, labels = pairing_canvases("train", 40, seed=3)
    assert canvases.shape == (40, 1, 32, 32) and labels.dtype == torch.int64
    assert int(labels.sum()) == 20  # balanced: half real, half recombined
    for (left, right), label in zip(_scans(canvases, images), labels.tolist(), strict=True):
        assert left != right
        assert label == int(targets[left] == targets[right])


def test_pairing_val_scans_are_disjoint_from_train_scans(originals) -> None:
    images, _ = originals
    train = {s for pair in _scans(pairing_canvases("train", 200, seed=1)[0], images) for s in pair}
    val = {s for pair in _scans(pairing_canvases("val", 100, seed=1)[0], images) for s in pair}
    assert train and val and not train & val


def test_recombined_takes_the_next_canvas_right_half_where_classes_differ() -> None:
    canvases = torch.rand(4, 1, 32, 32)
    out = recombined(canvases, torch.tensor([1, 1, 2, 3]))  # pairs (1, 2), (2, 3), (3, 0) differ
    assert out.shape == (3, 1, 32, 32)
    for row, (i, j) in enumerate([(1, 2), (2, 3), (3, 0)]):
        assert torch.equal(out[row, ..., :16], canvases[i, ..., :16])
        assert torch.equal(out[row, ..., 16:], canvases[j, ..., 16:])
    with pytest.raises(ValueError, match="one label each"):
        recombined(canvases, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="even number"):
        pairing_canvases("train", 7)
