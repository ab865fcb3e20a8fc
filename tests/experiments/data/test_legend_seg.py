"""legend_seg: determinism, and the dataset's promises checked from the generated pixels.

The key check compares pixels directly: every 3x3 window inside a blob must occur, exactly, in
the legend patch of the blob's label and in no other patch. Textures are periodic with period
<= 6 and each patch is at least 8x8, so a patch shows every window of its own texture.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
import torch
from numpy.lib.stride_tricks import sliding_window_view

from experiments.data import (
    IGNORE_INDEX,
    LegendLayout,
    LegendSegDataset,
    blob_mask,
)

WINDOW = 3


def _windows(image_hwc: np.ndarray) -> np.ndarray:
    """All WINDOW x WINDOW RGB windows of an (h, w, 3) array: (h-2, w-2, 3, 3, 3)."""
    return sliding_window_view(image_hwc, (WINDOW, WINDOW), axis=(0, 1))


def _window_set(image_hwc: np.ndarray) -> set[bytes]:
    windows = _windows(image_hwc)
    return {w.tobytes() for w in windows.reshape(-1, *windows.shape[2:])}


def _patch_signatures(image_hwc: np.ndarray, layout: LegendLayout) -> list[frozenset]:
    """Per legend patch, the set of distinct colours it shows (identifies its texture)."""
    return [
        frozenset(map(tuple, image_hwc[y0:y1, x0:x1].reshape(-1, 3).tolist()))
        for y0, y1, x0, x1 in layout.patch_boxes
    ]


@pytest.mark.parametrize(
    ("image_size", "num_classes"), [(64, 4), ((48, 80), 6)], ids=["default", "wide6"]
)
def test_blob_labels_match_the_legend_patch_with_the_same_texture(image_size, num_classes):
    ds = LegendSegDataset(25, image_size=image_size, num_classes=num_classes, seed=11)
    layout = ds.layout
    blobs_checked = 0
    for i in range(len(ds)):
        sample = ds.sample(i)
        image = sample.image.permute(1, 2, 0).numpy()
        mask, instances = sample.mask.numpy(), sample.instances.numpy()
        patch_windows = [_window_set(image[y0:y1, x0:x1]) for y0, y1, x0, x1 in layout.patch_boxes]
        assert len(set(map(frozenset, patch_windows))) == num_classes
        for blob in range(1, instances.max() + 1):
            inside = instances == blob
            labels = np.unique(mask[inside])
            assert labels.size == 1 and 1 <= labels[0] <= num_classes
            interior = sliding_window_view(inside, (WINDOW, WINDOW)).all(axis=(2, 3))
            assert interior.any(), f"image {i} blob {blob} has no 3x3 interior"
            blob_windows = _windows(image)[interior]
            for window in blob_windows:
                matches = [k for k, ws in enumerate(patch_windows) if window.tobytes() in ws]
                assert matches == [labels[0] - 1]
            blobs_checked += 1
    assert blobs_checked >= 2 * len(ds)


def test_mask_values_regions_and_blob_mask():
    ds = LegendSegDataset(20, seed=5)
    top = ds.layout.legend_height
    for i in range(len(ds)):
        sample = ds.sample(i)
        mask = sample.mask
        assert sample.image.shape == (3, 64, 64) and sample.image.dtype == torch.float32
        assert mask.shape == (64, 64) and mask.dtype == torch.int64
        assert sample.image.min() >= 0.0 and sample.image.max() <= 1.0
        assert torch.all(mask[:top] == IGNORE_INDEX)
        field = mask[top:]
        assert torch.all((field >= 0) & (field <= ds.num_classes))
        assert torch.equal(blob_mask(mask), sample.instances > 0)
        assert torch.equal(sample.blob_mask, (mask >= 1) & (mask <= ds.num_classes))


def test_texture_to_class_assignment_varies_across_images():
    """A texture (identified by its colours, read from the legend pixels) takes several classes."""
    ds = LegendSegDataset(60, seed=2)
    positions: dict[frozenset, set[int]] = defaultdict(set)
    orders = set()
    for i in range(len(ds)):
        image = ds[i][0].permute(1, 2, 0).numpy()
        signatures = _patch_signatures(image, ds.layout)
        orders.add(tuple(signatures))
        for k, signature in enumerate(signatures):
            positions[signature].add(k)
    assert len(positions) > ds.num_classes
    assert all(len(seen) >= 2 for seen in positions.values())
    assert len(orders) > len(ds) // 2


def test_same_seed_gives_identical_items_and_other_seeds_or_splits_differ():
    a = LegendSegDataset(6, seed=3)
    b = LegendSegDataset(6, seed=3)
    for i in reversed(range(6)):
        image_b, mask_b = b[i]
        image_a, mask_a = a[i]
        assert torch.equal(image_a, image_b) and torch.equal(mask_a, mask_b)
    other_seed = LegendSegDataset(6, seed=4)
    other_split = LegendSegDataset(6, seed=3, split="val")
    for other in (other_seed, other_split):
        assert all(not torch.equal(a[i][1], other[i][1]) for i in range(6))
    assert not torch.equal(a[0][0], a[1][0])


def test_materialize_stacks_every_item():
    ds = LegendSegDataset(5, seed=1)
    images, masks = ds.materialize()
    assert images.shape == (5, 3, 64, 64) and masks.shape == (5, 64, 64)
    for i in range(5):
        assert torch.equal(images[i], ds[i][0]) and torch.equal(masks[i], ds[i][1])
    assert torch.equal(ds[-1][1], ds[4][1])
    with pytest.raises(IndexError):
        ds[5]


def test_invalid_geometry_is_rejected_with_the_fix():
    with pytest.raises(ValueError, match="num_classes <= 8"):
        LegendSegDataset(2, num_classes=9)
    with pytest.raises(ValueError, match="width >= 60"):
        LegendSegDataset(2, image_size=(64, 48), num_classes=6)
    with pytest.raises(ValueError, match="height >= 26"):
        LegendSegDataset(2, image_size=(20, 64))
    with pytest.raises(ValueError, match="split"):
        LegendSegDataset(2, split="training")
