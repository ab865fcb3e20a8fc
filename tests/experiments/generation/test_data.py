"""Twin-digit canvases: two different digits of one class, placed and upsampled as documented,
from disjoint digit images in train and val, deterministic by seed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from experiments.data.twin_digits import (
    TwinDigitsDataset,
    compose_canvases,
    from_gan_range,
    halves,
    pair_indices,
    to_gan_range,
)


def bilinear_2x(image: np.ndarray) -> np.ndarray:
    """Independent 2x bilinear upsampling with half-pixel centres (align_corners=False):
    output pixel i samples the input at (i + 0.5) / 2 - 0.5, clamped to the border."""
    n = image.shape[0]
    coords = np.clip((np.arange(2 * n) + 0.5) / 2 - 0.5, 0, n - 1)
    lo = np.floor(coords).astype(int)
    hi = np.minimum(lo + 1, n - 1)
    w = coords - lo
    rows = image[lo] * (1 - w)[:, None] + image[hi] * w[:, None]
    return rows[:, lo] * (1 - w)[None, :] + rows[:, hi] * w[None, :]


@pytest.fixture(scope="module")
def originals() -> tuple[np.ndarray, np.ndarray]:
    bunch = load_digits()
    return bunch.images / 16.0, bunch.target


def test_canvas_halves_are_two_different_upsampled_digits_of_one_class(originals) -> None:
    images, targets = originals
    ds = TwinDigitsDataset("train", size=64, seed=0)
    assert len(ds) == 64 and ds.canvases.shape == (64, 1, 32, 32)
    assert ds.canvases.dtype == torch.float32
    assert float(ds.canvases.min()) >= 0 and float(ds.canvases.max()) <= 1
    for i in (0, 17, 63):
        a, b = (int(ds.digit_indices[j]) for j in ds.pairs[i])
        assert a != b and targets[a] == targets[b] == ds[i][1]
        canvas = ds[i][0][0].numpy()
        np.testing.assert_allclose(canvas[8:24, :16], bilinear_2x(images[a]), atol=1e-6)
        np.testing.assert_allclose(canvas[8:24, 16:], bilinear_2x(images[b]), atol=1e-6)
        assert not canvas[:8].any() and not canvas[24:].any()


def test_train_and_val_share_no_digit_image_and_are_deterministic() -> None:
    train, val = TwinDigitsDataset("train", 32, seed=1), TwinDigitsDataset("val", 32, seed=1)
    assert not set(train.digit_indices) & set(val.digit_indices)
    again = TwinDigitsDataset("train", 32, seed=1)
    assert torch.equal(train.canvases, again.canvases)
    other = TwinDigitsDataset("train", 32, seed=2)
    assert not torch.equal(train.canvases, other.canvases)


def test_pairs_cover_every_class_and_never_repeat_an_item() -> None:
    labels = np.repeat(np.arange(10), 5)
    pairs = pair_indices(labels, 500, seed=0)
    assert (pairs[:, 0] != pairs[:, 1]).all()
    assert (labels[pairs[:, 0]] == labels[pairs[:, 1]]).all()
    assert set(labels[pairs[:, 0]]) == set(range(10))
    with pytest.raises(ValueError, match="fewer than two"):
        pair_indices(np.array([0, 1, 1]), 4, seed=0)


def test_helpers_round_trip_and_split_halves() -> None:
    left, right = torch.rand(3, 16, 16), torch.rand(3, 16, 16)
    canvas = compose_canvases(left, right)
    lh, rh = halves(canvas)
    assert lh.shape == rh.shape == (3, 1, 32, 16)
    assert torch.equal(lh[:, 0, 8:24], left) and torch.equal(rh[:, 0, 8:24], right)
    torch.testing.assert_close(from_gan_range(to_gan_range(canvas)), canvas)
    with pytest.raises(ValueError, match="16, 16"):
        compose_canvases(torch.rand(2, 8, 8), torch.rand(2, 8, 8))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"split": "test"}, "split"), ({"size": 0}, "size"), ({"val_fraction": 1.0}, "val_fraction")],
)
def test_bad_arguments_are_refused_with_their_name(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        TwinDigitsDataset(**kwargs)
