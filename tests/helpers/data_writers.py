"""Write tiny datasets to disk in the exact on-disk formats of CIFAR-10 and PASCAL VOC 2012.

Used by the tests of ``experiments.data``; the formats follow the datasets' own documentation
(CIFAR-10 "python version" pickles; VOCdevkit with JPEG photos and palette PNG class masks).
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
from PIL import Image


def write_cifar_batches(
    folder: Path, train_sizes: tuple[int, ...] = (3, 2, 3, 2, 3), test_size: int = 4, seed: int = 0
) -> dict[str, tuple[np.ndarray, list[int]]]:
    """Write data_batch_1..5, test_batch and batches.meta into ``folder``.

    Returns ``{file name: (data uint8 (N, 3072), labels)}`` for the batches written.
    """
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    written = {}
    for name, n in zip(names, (*train_sizes, test_size), strict=True):
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, size=n)]
        batch = {b"batch_label": name.encode(), b"labels": labels, b"data": data, b"filenames": []}
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
        written[name] = (data, labels)
    meta = {b"label_names": [f"class{i}".encode() for i in range(10)], b"num_vis": 3072}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
    return written


def voc_palette() -> list[int]:
    """A 256-entry RGB palette (flattened), as the VOC masks carry; 255 (void) is cream."""
    rng = np.random.default_rng(7)
    palette = rng.integers(0, 256, size=(256, 3))
    palette[0] = 0
    palette[255] = (224, 224, 192)
    return [int(v) for v in palette.ravel()]


def write_voc_tree(
    root: Path, splits: dict[str, list[str]], height: int = 20, width: int = 30, seed: int = 0
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Write ``root/VOCdevkit/VOC2012`` with one JPEG and one palette PNG mask per image id.

    Images are blocks of flat colour (so JPEG stays close to them); masks hold classes 0..20 on
    the same blocks with a void (255) border between them, as VOC's object outlines are.

    Returns ``{image id: (image uint8 (H, W, 3), mask uint8 (H, W))}``.
    """
    voc = root / "VOCdevkit" / "VOC2012"
    for part in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation"):
        (voc / part).mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    written = {}
    ids = sorted({image_id for members in splits.values() for image_id in members})
    for image_id in ids:
        colours = rng.integers(0, 256, size=(2, 3), dtype=np.uint8)
        classes = rng.choice(np.arange(1, 21), size=2, replace=False).astype(np.uint8)
        image = np.empty((height, width, 3), dtype=np.uint8)
        mask = np.zeros((height, width), dtype=np.uint8)
        split_col = width // 2
        image[:, :split_col], image[:, split_col:] = colours[0], colours[1]
        mask[:, :split_col], mask[:, split_col:] = classes[0], classes[1]
        mask[height // 2 :, : width // 4] = 0
        mask[:, split_col - 1 : split_col + 1] = 255
        Image.fromarray(image).save(voc / "JPEGImages" / f"{image_id}.jpg", quality=95)
        png = Image.frombytes("P", (width, height), mask.tobytes())
        png.putpalette(voc_palette())
        png.save(voc / "SegmentationClass" / f"{image_id}.png")
        written[image_id] = (image, mask)
    for split, members in splits.items():
        (voc / "ImageSets" / "Segmentation" / f"{split}.txt").write_text("\n".join(members) + "\n")
    return written
