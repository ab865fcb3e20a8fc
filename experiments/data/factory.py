"""Build datasets by name and describe the task each one poses, so a model can be built to match.

``make_dataset("legend_seg", split="val", size=200)`` and ``task_of("legend_seg")`` take the
same keyword arguments; unknown names and unknown keywords are errors listing the valid ones.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from torch import Tensor
from torch.utils.data import Dataset

from experiments.data import cifar10, digits, voc
from experiments.data.cifar10 import CIFAR10Dataset
from experiments.data.digits import DigitsDataset
from experiments.data.errors import DataLayoutError
from experiments.data.legend_dataset import LegendSegDataset
from experiments.data.legend_seg import IGNORE_INDEX
from experiments.data.voc import VOCSegmentation

LEGEND_SEG_SIZES = MappingProxyType({"train": 1000, "val": 200, "test": 200})


@dataclass(frozen=True)
class TaskInfo:
    """What a dataset asks of a model.

    Attributes:
        kind: "segmentation" (per-pixel labels ``(H, W)``), "classification" (one label),
            "masked_cell" or "pairing" (far-twin canvases: the models of
            ``experiments.models.masked_cell``).
        num_classes: number of model outputs (for segmentation, background included).
        in_channels: channels of the input images.
        ignore_index: label to leave out of losses and metrics, or None.
        image_size: ``(height, width)`` of every input, or None when it varies.
        length: N of a sequence task's inputs ((B, N) token ids or (B, C, N)), else None.
        vocab_size: token ids of a token task ((B, N) int64 inputs), else None.
        loss: ``(output, target) -> 0-d loss`` for a task that is not scored by cross-entropy
            (kind "masked_cell": ``experiments.data.far_twins.masked_cell_loss``); None: the
            engine's cross-entropy and confusion-matrix metrics.
    """

    kind: str
    num_classes: int
    in_channels: int
    ignore_index: int | None
    image_size: tuple[int, int] | None
    length: int | None = None
    vocab_size: int | None = None
    loss: Callable[[Tensor, Tensor], Tensor] | None = None


@dataclass(frozen=True)
class _Entry:
    build: Callable[..., Dataset]
    task: Callable[..., TaskInfo]
    needs_root: bool
    options: tuple[str, ...]  # the keywords of make_dataset / task_of
    expected_layout: str = ""


def _square(size: int | tuple[int, int] | None) -> tuple[int, int] | None:
    """``(size, size)`` for an int, ``(height, width)`` for a pair, None for None."""
    if size is None:
        return None
    if isinstance(size, int):
        return (size, size)
    height, width = size
    return (height, width)


def _legend_seg(split: str, size: int | None = None, **kw: Any) -> LegendSegDataset:
    if size is None:
        size = LEGEND_SEG_SIZES.get(split, LEGEND_SEG_SIZES["val"])
    return LegendSegDataset(size, split=split, **kw)


def _legend_task(
    num_classes: int = 4, image_size: int | tuple[int, int] = 64, **_: Any
) -> TaskInfo:
    return TaskInfo("segmentation", num_classes + 1, 3, IGNORE_INDEX, _square(image_size))


def _voc_task(size: int | tuple[int, int] | None = None, **_: Any) -> TaskInfo:
    return TaskInfo("segmentation", voc.NUM_CLASSES, 3, voc.VOID_INDEX, _square(size))


_ENTRIES: Mapping[str, _Entry] = MappingProxyType(
    {
        "legend_seg": _Entry(
            build=_legend_seg,
            task=_legend_task,
            needs_root=False,
            options=("size", "image_size", "num_classes", "seed", "legend_height", "blob_count"),
        ),
        "digits": _Entry(
            build=DigitsDataset,
            task=lambda **_: TaskInfo("classification", digits.NUM_CLASSES, 1, None, (8, 8)),
            needs_root=False,
            options=("val_fraction", "seed"),
        ),
        "cifar10": _Entry(
            build=CIFAR10Dataset,
            task=lambda **_: TaskInfo("classification", cifar10.NUM_CLASSES, 3, None, (32, 32)),
            needs_root=True,
            options=(),
            expected_layout=cifar10.EXPECTED_LAYOUT,
        ),
        "voc2012": _Entry(
            build=VOCSegmentation,
            task=_voc_task,
            needs_root=True,
            options=("size", "resize_mode"),
            expected_layout=voc.EXPECTED_LAYOUT,
        ),
    }
)
DATASET_NAMES = tuple(_ENTRIES)


def make_dataset(
    name: str, root: str | Path | None = None, split: str = "train", **kw: Any
) -> Dataset:
    """The dataset ``name`` ("legend_seg", "digits", "cifar10" or "voc2012").

    Args:
        name: dataset name.
        root: data folder for datasets read from disk (cifar10, voc2012); must be None for
            the built-in ones (legend_seg, digits).
        split: "train", "val", "test" or "trainval", as the dataset supports.
        **kw: dataset options: legend_seg ``size`` (default 1000 for train, 200 otherwise),
            ``image_size``, ``num_classes``, ``seed``, ``legend_height``, ``blob_count``;
            digits ``val_fraction``, ``seed``; voc2012 ``size``, ``resize_mode``.
    """
    entry = _entry(name)
    _check_options(name, entry, kw)
    if not entry.needs_root:
        if root is not None:
            raise ValueError(f"dataset {name!r} is built in and takes no root; pass root=None")
        return entry.build(split=split, **kw)
    if root is None:
        raise DataLayoutError(
            f"dataset {name!r} is read from disk and needs a root",
            "(root=None)",
            f"pass root=<folder>, e.g. make_dataset({name!r}, root='data/{name}')",
            entry.expected_layout,
        )
    return entry.build(root, split=split, **kw)


def task_of(name: str, **kw: Any) -> TaskInfo:
    """The task of dataset ``name`` built with options ``kw`` (the keywords of ``make_dataset``).

    For legend_seg, ``num_classes`` counts blob classes; the task's ``num_classes`` adds the
    background class.
    """
    entry = _entry(name)
    _check_options(name, entry, kw)
    return entry.task(**kw)


def _entry(name: str) -> _Entry:
    if name not in _ENTRIES:
        raise KeyError(f"unknown dataset {name!r}; valid choices: {', '.join(DATASET_NAMES)}")
    return _ENTRIES[name]


def _check_options(name: str, entry: _Entry, kw: Mapping[str, Any]) -> None:
    valid = entry.options
    unknown = sorted(set(kw) - set(valid))
    if unknown:
        raise TypeError(
            f"unknown option(s) {', '.join(unknown)} for dataset {name!r}; "
            f"valid options: {', '.join(valid) or '(none)'}"
        )
