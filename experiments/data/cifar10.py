"""CIFAR-10 from the "python version" pickle batches a user already has on disk (no download).

Each batch file is a pickled dict with ``b"data"``, uint8 ``(N, 3072)`` (the red, green and blue
32x32 planes of each image, row-major), and ``b"labels"``, N integers in 0..9; ``batches.meta``
holds ``b"label_names"``. The files are unpickled with a restricted unpickler that only
rebuilds plain containers and numpy arrays, so a tampered file cannot run code.
"""

from __future__ import annotations

import functools
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from experiments.data.errors import DataLayoutError
from implicit_ham.plugins import check_choice

SPLITS = ("train", "test")
NUM_CLASSES = 10
IMAGE_SHAPE = (3, 32, 32)
BATCH_FILES = {"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",)}
META_FILE = "batches.meta"
FOLDER = "cifar-10-batches-py"
EXPECTED_LAYOUT = f"""\
ROOT/                       (ROOT may also be the {FOLDER} folder itself)
└── {FOLDER}/
    ├── batches.meta        pickled dict: b"label_names" -> 10 names
    ├── data_batch_1        pickled dict: b"data" uint8 (N, 3072), b"labels" N ints in 0..9
    ├── data_batch_2
    ├── data_batch_3
    ├── data_batch_4
    ├── data_batch_5
    └── test_batch
"""
FIX = (
    "point root at the folder holding the extracted CIFAR-10 python archive "
    "(cifar-10-python.tar.gz)"
)
# a DataLayoutError(problem, path) of this loader: its fix and expected layout
_layout_error = functools.partial(DataLayoutError, fix=FIX, expected_layout=EXPECTED_LAYOUT)
_ALLOWED_GLOBALS = {
    ("_codecs", "encode"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
}


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles dicts, lists, strings, numbers and numpy arrays; refuses every other class."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return super().find_class(module, name)


def resolve_cifar_root(root: str | Path) -> Path:
    """The folder holding the batch files: ``root/cifar-10-batches-py`` or ``root`` itself."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise _layout_error("CIFAR-10 root does not exist", root)
    nested = root / FOLDER
    return nested if nested.is_dir() else root


def read_batch(path: Path) -> dict[str, Any]:
    """Unpickle one batch file into a dict with str keys; malformed files raise DataLayoutError."""
    if not path.is_file():
        raise _layout_error("missing CIFAR-10 file", path)
    try:
        with path.open("rb") as handle:
            content = _ArrayUnpickler(handle, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as error:
        raise _layout_error(
            f"malformed CIFAR-10 file (not a CIFAR pickle: {error})", path
        ) from error
    if not isinstance(content, dict):
        raise _layout_error(
            f"malformed CIFAR-10 file (holds a {type(content).__name__}, not a dict)", path
        )
    return {
        key.decode() if isinstance(key, bytes) else str(key): value
        for key, value in content.items()
    }


def load_cifar_arrays(folder: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Images uint8 ``(N, 3, 32, 32)`` and labels int64 ``(N,)`` of one split, checked."""
    images, labels = [], []
    for name in BATCH_FILES[split]:
        batch = read_batch(folder / name)
        data, batch_labels = batch.get("data"), batch.get("labels")
        problem = _batch_problem(data, batch_labels)
        if problem:
            raise _layout_error(f"malformed CIFAR-10 file ({problem})", folder / name)
        images.append(np.asarray(data).reshape(-1, *IMAGE_SHAPE))
        labels.append(np.asarray(batch_labels, dtype=np.int64))
    return np.concatenate(images), np.concatenate(labels)


def _batch_problem(data: object, labels: object) -> str | None:
    """What is wrong with a batch's data and labels, or None."""
    if data is None or labels is None:
        return 'needs the keys b"data" and b"labels"'
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2:
        return 'b"data" must be a uint8 array of shape (N, 3072)'
    if data.shape[1] != int(np.prod(IMAGE_SHAPE)):
        return f'b"data" has {data.shape[1]} columns, expected 3072'
    label_array = np.asarray(labels)
    if label_array.shape != (data.shape[0],) or not np.issubdtype(label_array.dtype, np.integer):
        return f'b"labels" must hold {data.shape[0]} integers, one per image'
    if label_array.size and (label_array.min() < 0 or label_array.max() >= NUM_CLASSES):
        return f'b"labels" must lie in 0..{NUM_CLASSES - 1}'
    return None


def read_label_names(folder: Path) -> tuple[str, ...]:
    """The 10 class names from ``batches.meta``."""
    names = read_batch(folder / META_FILE).get("label_names")
    if not isinstance(names, list) or len(names) != NUM_CLASSES:
        raise _layout_error(
            f'malformed CIFAR-10 file (b"label_names" must list {NUM_CLASSES} names)',
            folder / META_FILE,
        )
    return tuple(n.decode() if isinstance(n, bytes) else str(n) for n in names)


class CIFAR10Dataset(Dataset[tuple[Tensor, int]]):
    """CIFAR-10 from disk: items ``(image, label)``, image float32 ``(3, 32, 32)`` in [0, 1].

    Args:
        root: the folder holding ``cifar-10-batches-py/`` (or that folder itself).
        split: "train" (data_batch_1..5, 50000 images) or "test" (test_batch, 10000).
    """

    def __init__(self, root: str | Path, split: str = "train") -> None:
        check_choice("CIFAR10Dataset", "split", split, SPLITS)
        self.folder = resolve_cifar_root(root)
        self.classes = read_label_names(self.folder)
        images, labels = load_cifar_arrays(self.folder, split)
        self.images = torch.from_numpy(images)
        self.labels = torch.from_numpy(labels)
        self.split = split

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        return self.images[index].float() / 255.0, int(self.labels[index])

    def __repr__(self) -> str:
        return (
            f"CIFAR10Dataset(folder={str(self.folder)!r}, split={self.split!r}, size={len(self)})"
        )
