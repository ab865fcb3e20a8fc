"""PASCAL VOC 2012 semantic segmentation from an extracted VOCdevkit on disk (no download).

Images are JPEGs; masks are palette PNGs whose pixel values are class indices 0..20 with 255
marking "void" (object borders and ambiguous pixels), which losses and metrics should ignore.
Images and masks are read with PIL; an optional fixed output size resizes (or resizes and
centre-crops) both, with nearest-neighbour interpolation for the masks so no label is invented.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch import Tensor
from torch.utils.data import Dataset

from experiments.data.errors import DataLayoutError
from implicit_ham.plugins import check_choice, check_positive_int

SPLITS = ("train", "val", "trainval")
RESIZE_MODES = ("resize", "center_crop")
NUM_CLASSES = 21
VOID_INDEX = 255
EXPECTED_LAYOUT = """\
ROOT/                              (ROOT may also be VOCdevkit/ or VOCdevkit/VOC2012/)
└── VOCdevkit/
    └── VOC2012/
        ├── JPEGImages/            <id>.jpg: RGB photo
        ├── SegmentationClass/     <id>.png: palette PNG, class index 0..20 per pixel, 255 = void
        └── ImageSets/
            └── Segmentation/
                ├── train.txt      one image id per line (e.g. 2007_000032)
                └── val.txt
"""
FIX = "point root at the folder holding the extracted VOCtrainval_11-May-2012.tar (VOCdevkit/)"
# a DataLayoutError(problem, path) of this loader: its fix and expected layout
_layout_error = functools.partial(DataLayoutError, fix=FIX, expected_layout=EXPECTED_LAYOUT)


def resolve_voc_root(root: str | Path) -> Path:
    """The VOC2012 folder: ``root/VOCdevkit/VOC2012``, ``root/VOC2012`` or ``root`` itself."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise _layout_error("PASCAL VOC root does not exist", root)
    candidates = (root / "VOCdevkit" / "VOC2012", root / "VOC2012", root)
    voc = next((c for c in candidates if (c / "JPEGImages").is_dir()), root)
    for part in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation"):
        if not (voc / part).is_dir():
            raise _layout_error(f"PASCAL VOC folder {part}/ not found", voc / part)
    return voc


def read_split_ids(voc: Path, split: str) -> list[str]:
    """Image ids listed in ``ImageSets/Segmentation/<split>.txt``, each with its JPEG and PNG."""
    listing = voc / "ImageSets" / "Segmentation" / f"{split}.txt"
    if not listing.is_file():
        raise _layout_error(f"missing split list {split}.txt", listing)
    ids = [line.strip() for line in listing.read_text().splitlines() if line.strip()]
    if not ids:
        raise _layout_error(f"split list {split}.txt is empty", listing)
    for image_id in ids:
        for path in (image_path(voc, image_id), mask_path(voc, image_id)):
            if not path.is_file():
                raise _layout_error(f"{split}.txt lists {image_id!r} but its file is missing", path)
    return ids


def image_path(voc: Path, image_id: str) -> Path:
    """Where the JPEG of ``image_id`` lives."""
    return voc / "JPEGImages" / f"{image_id}.jpg"


def mask_path(voc: Path, image_id: str) -> Path:
    """Where the class mask of ``image_id`` lives."""
    return voc / "SegmentationClass" / f"{image_id}.png"


def open_image(path: Path, modes: tuple[str, ...]) -> Image.Image:
    """Open ``path`` with PIL in one of ``modes``; unreadable files raise DataLayoutError."""
    try:
        with Image.open(path) as handle:
            handle.load()
            picture = handle.copy()
    except (UnidentifiedImageError, OSError) as error:
        raise _layout_error(
            f"malformed PASCAL VOC file (PIL cannot read it: {error})", path
        ) from error
    if picture.mode not in modes:
        raise _layout_error(
            f"malformed PASCAL VOC file (image mode {picture.mode}, expected {' or '.join(modes)}; "
            "masks must be palette PNGs of class indices, not colour images)",
            path,
        )
    return picture


def fit_pair(
    image: Image.Image, mask: Image.Image, size: tuple[int, int], mode: str
) -> tuple[Image.Image, Image.Image]:
    """Bring image and mask to ``size = (height, width)``: bilinear image, nearest-neighbour mask.

    ``mode="resize"`` stretches to the size; ``mode="center_crop"`` scales so that the size fits
    inside and crops the centre, keeping the aspect ratio.
    """
    height, width = size
    if mode == "resize":
        return (
            image.resize((width, height), Image.Resampling.BILINEAR),
            mask.resize((width, height), Image.Resampling.NEAREST),
        )
    scale = max(height / image.height, width / image.width)
    scaled = (max(width, round(image.width * scale)), max(height, round(image.height * scale)))
    left, top = (scaled[0] - width) // 2, (scaled[1] - height) // 2
    box = (left, top, left + width, top + height)
    return (
        image.resize(scaled, Image.Resampling.BILINEAR).crop(box),
        mask.resize(scaled, Image.Resampling.NEAREST).crop(box),
    )


class VOCSegmentation(Dataset[tuple[Tensor, Tensor]]):
    """PASCAL VOC 2012 segmentation: items ``(image, mask)``.

    ``image`` is float32 ``(3, H, W)`` in [0, 1]; ``mask`` is int64 ``(H, W)`` with classes 0..20
    (0 = background) and 255 = void (``ignore_index``).

    Args:
        root: the folder holding ``VOCdevkit/`` (or ``VOCdevkit/``, or ``VOC2012/`` itself).
        split: "train", "val" or "trainval" (the list file must exist).
        size: output ``(height, width)`` (an int for a square); None keeps each image's size.
        resize_mode: "resize" (stretch) or "center_crop" (keep aspect ratio, crop the centre).
    """

    ignore_index = VOID_INDEX

    def __init__(
        self,
        root: str | Path,
        split: str = "train",
        size: int | tuple[int, int] | None = None,
        resize_mode: str = "resize",
    ) -> None:
        owner = "VOCSegmentation"
        check_choice(owner, "split", split, SPLITS)
        check_choice(owner, "resize_mode", resize_mode, RESIZE_MODES)
        self.size = (size, size) if isinstance(size, int) else size
        if self.size is not None:
            for side in self.size:
                check_positive_int(owner, "size", side)
        self.voc = resolve_voc_root(root)
        self.ids = read_split_ids(self.voc, split)
        self.split = split
        self.resize_mode = resize_mode

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        image_id = self.ids[index]
        image = open_image(image_path(self.voc, image_id), ("RGB", "L")).convert("RGB")
        mask = open_image(mask_path(self.voc, image_id), ("P", "L"))
        if image.size != mask.size:
            raise _layout_error(
                f"image {image.size} and mask {mask.size} of {image_id!r} differ in size",
                mask_path(self.voc, image_id),
            )
        if self.size is not None:
            image, mask = fit_pair(image, mask, self.size, self.resize_mode)
        pixels = np.asarray(image, dtype=np.float32).transpose(2, 0, 1) / 255.0
        labels = np.asarray(mask, dtype=np.int64)
        if ((labels >= NUM_CLASSES) & (labels != VOID_INDEX)).any():
            raise _layout_error(
                f"malformed PASCAL VOC mask (values outside 0..{NUM_CLASSES - 1} and {VOID_INDEX})",
                mask_path(self.voc, image_id),
            )
        return torch.from_numpy(np.ascontiguousarray(pixels)), torch.from_numpy(labels.copy())

    def __repr__(self) -> str:
        return (
            f"VOCSegmentation(voc={str(self.voc)!r}, split={self.split!r}, size={self.size}, "
            f"resize_mode={self.resize_mode!r}, images={len(self)})"
        )
