"""The bundled 8x8 digits: values, stratified deterministic split."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from experiments.data import DigitsDataset


@pytest.fixture(scope="module")
def reference():
    bunch = load_digits()
    return bunch.data.reshape(-1, 8, 8) / 16.0, bunch.target


def test_items_are_scaled_pixels_and_labels_of_the_original(reference):
    images, targets = reference
    ds = DigitsDataset("val", seed=0)
    for position in (0, 7, len(ds) - 1):
        image, label = ds[position]
        original = ds.indices[position]
        assert image.shape == (1, 8, 8) and image.dtype == torch.float32
        np.testing.assert_allclose(image[0].numpy(), images[original], rtol=0, atol=1e-7)
        assert label == targets[original]
    assert float(ds.images.min()) >= 0.0 and float(ds.images.max()) == 1.0


def test_split_is_disjoint_complete_and_stratified(reference):
    _, targets = reference
    train, val = DigitsDataset("train", seed=1), DigitsDataset("val", seed=1)
    assert not set(train.indices) & set(val.indices)
    assert len(train) + len(val) == len(targets)
    for digit in range(10):
        in_class = int((targets == digit).sum())
        assert int((val.labels == digit).sum()) == round(0.2 * in_class)


def test_split_is_fixed_by_the_seed():
    assert np.array_equal(
        DigitsDataset("val", seed=4).indices, DigitsDataset("val", seed=4).indices
    )
    assert not np.array_equal(
        DigitsDataset("val", seed=4).indices, DigitsDataset("val", seed=5).indices
    )


def test_bad_arguments_name_the_fix():
    with pytest.raises(ValueError, match="train, val"):
        DigitsDataset("test")
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        DigitsDataset("train", val_fraction=1.0)
