"""PASCAL VOC 2012 loader on a tiny VOCdevkit written in the real formats; resizing; errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.data_writers import voc_palette, write_voc_tree
from PIL import Image

from experiments.data import DataLayoutError, VOCSegmentation

SPLITS = {"train": ["2007_000032", "2007_000039"], "val": ["2007_000033"]}


@pytest.fixture()
def voc_root(tmp_path):
    written = write_voc_tree(tmp_path, SPLITS)
    return tmp_path, written


def test_images_and_masks_keep_classes_and_void(voc_root):
    root, written = voc_root
    ds = VOCSegmentation(root, "train")
    assert ds.ids == SPLITS["train"] and len(VOCSegmentation(root, "val")) == 1
    for index, image_id in enumerate(SPLITS["train"]):
        image, mask = ds[index]
        photo, labels = written[image_id]
        assert image.shape == (3, 20, 30) and image.dtype == torch.float32
        assert mask.shape == (20, 30) and mask.dtype == torch.int64
        assert np.array_equal(mask.numpy(), labels)
        assert (mask == 255).any() and (mask == 0).any()
        error = np.abs(image.permute(1, 2, 0).numpy() - photo / 255.0)
        assert np.median(error) < 0.02


@pytest.mark.parametrize("layout", ["root", "VOCdevkit", "VOC2012"])
def test_root_may_point_at_any_level_of_the_tree(voc_root, layout):
    root, _ = voc_root
    path = {
        "root": root,
        "VOCdevkit": root / "VOCdevkit",
        "VOC2012": root / "VOCdevkit" / "VOC2012",
    }[layout]
    assert len(VOCSegmentation(path, "train")) == 2


def test_resize_upsamples_masks_by_nearest_neighbour(voc_root):
    root, written = voc_root
    image, mask = VOCSegmentation(root, "train", size=(40, 60))[0]
    labels = written[SPLITS["train"][0]][1]
    assert image.shape == (3, 40, 60)
    assert np.array_equal(mask.numpy(), labels.repeat(2, axis=0).repeat(2, axis=1))


def test_center_crop_keeps_the_aspect_ratio(voc_root):
    root, written = voc_root
    labels = written[SPLITS["train"][1]][1]
    _, mask = VOCSegmentation(root, "train", size=20, resize_mode="center_crop")[1]
    assert np.array_equal(mask.numpy(), labels[:, 5:25])
    image, mask = VOCSegmentation(root, "train", size=10, resize_mode="center_crop")[1]
    assert image.shape == (3, 10, 10) and mask.shape == (10, 10)
    assert set(np.unique(mask.numpy())) <= set(np.unique(labels))


def test_missing_root_prints_the_expected_layout(tmp_path):
    with pytest.raises(DataLayoutError) as error:
        VOCSegmentation(tmp_path / "absent")
    message = str(error.value)
    assert "does not exist" in message and "Expected layout:" in message
    for part in ("VOCdevkit/", "VOC2012/", "JPEGImages/", "SegmentationClass/", "train.txt"):
        assert part in message


def test_incomplete_tree_names_the_missing_folder(voc_root):
    root, _ = voc_root
    mask_folder = root / "VOCdevkit" / "VOC2012" / "SegmentationClass"
    for png in mask_folder.iterdir():
        png.unlink()
    mask_folder.rmdir()
    with pytest.raises(DataLayoutError, match=r"SegmentationClass/ not found(.|\n)*Expected"):
        VOCSegmentation(root)


def test_listed_image_without_file_is_reported(voc_root):
    root, _ = voc_root
    listing = root / "VOCdevkit" / "VOC2012" / "ImageSets" / "Segmentation" / "val.txt"
    listing.write_text("2007_000033\n2007_999999\n")
    with pytest.raises(DataLayoutError, match="2007_999999"):
        VOCSegmentation(root, "val")
    with pytest.raises(DataLayoutError, match=r"trainval\.txt"):
        VOCSegmentation(root, "trainval")


def test_colour_mask_instead_of_palette_is_malformed(voc_root):
    root, _ = voc_root
    path = root / "VOCdevkit" / "VOC2012" / "SegmentationClass" / "2007_000033.png"
    with Image.open(path) as png:
        png.convert("RGB").save(path)
    with pytest.raises(DataLayoutError, match=r"mode RGB(.|\n)*Expected layout"):
        VOCSegmentation(root, "val")[0]


def test_out_of_range_labels_and_corrupt_jpeg_are_malformed(voc_root):
    root, _ = voc_root
    voc = root / "VOCdevkit" / "VOC2012"
    bad = np.full((20, 30), 50, dtype=np.uint8)
    png = Image.frombytes("P", (30, 20), bad.tobytes())
    png.putpalette(voc_palette())
    png.save(voc / "SegmentationClass" / "2007_000033.png")
    with pytest.raises(DataLayoutError, match=r"outside 0\.\.20"):
        VOCSegmentation(root, "val")[0]
    (voc / "JPEGImages" / "2007_000032.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(DataLayoutError, match="PIL cannot read it"):
        VOCSegmentation(root, "train")[0]


def test_bad_options_list_the_choices(voc_root):
    root, _ = voc_root
    with pytest.raises(ValueError, match="resize, center_crop"):
        VOCSegmentation(root, resize_mode="stretch")
    with pytest.raises(ValueError, match="train, val, trainval"):
        VOCSegmentation(root, split="test")
