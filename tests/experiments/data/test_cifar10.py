"""CIFAR-10 loader on tiny batches written in the real pickle format; layout errors."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch
from helpers.data_writers import write_cifar_batches

from experiments.data import CIFAR10Dataset, DataLayoutError


def _pixel(data_row: np.ndarray, channel: int, y: int, x: int) -> int:
    """CIFAR row layout: 1024 red values, then green, then blue, each 32x32 row-major."""
    return int(data_row[channel * 1024 + y * 32 + x])


@pytest.mark.parametrize("nested", [True, False], ids=["root", "batches_folder"])
def test_train_and_test_images_and_labels_follow_the_format(tmp_path, nested):
    written = write_cifar_batches(tmp_path / "cifar-10-batches-py")
    root = tmp_path if nested else tmp_path / "cifar-10-batches-py"
    train = CIFAR10Dataset(root, "train")
    test = CIFAR10Dataset(root, split="test")
    assert len(train) == 13 and len(test) == 4
    assert train.classes[3] == "class3"
    rows = [
        (row, label)
        for name in [f"data_batch_{i}" for i in range(1, 6)]
        for row, label in zip(*written[name], strict=True)
    ]
    rng = np.random.default_rng(0)
    for index in (0, 3, 12):
        image, label = train[index]
        row, expected_label = rows[index]
        assert image.shape == (3, 32, 32) and image.dtype == torch.float32
        assert label == expected_label
        for c, y, x in rng.integers(0, 32, size=(20, 3)) % [3, 32, 32]:
            assert image[c, y, x].item() == pytest.approx(_pixel(row, c, y, x) / 255.0, abs=1e-7)
    image, label = test[1]
    assert label == written["test_batch"][1][1]
    assert image[2, 31, 31].item() == pytest.approx(written["test_batch"][0][1][3071] / 255.0)


def test_missing_root_prints_the_expected_layout(tmp_path):
    with pytest.raises(DataLayoutError) as error:
        CIFAR10Dataset(tmp_path / "nowhere")
    message = str(error.value)
    assert "does not exist" in message and "nowhere" in message
    assert "Expected layout:" in message
    for name in (
        "cifar-10-batches-py/",
        "data_batch_1",
        "data_batch_5",
        "test_batch",
        "batches.meta",
    ):
        assert name in message


def test_missing_batch_names_the_file(tmp_path):
    write_cifar_batches(tmp_path)
    (tmp_path / "data_batch_3").unlink()
    with pytest.raises(
        DataLayoutError, match=r"missing CIFAR-10 file.*data_batch_3(.|\n)*Expected"
    ):
        CIFAR10Dataset(tmp_path)
    assert len(CIFAR10Dataset(tmp_path, "test")) == 4


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (pickle.dumps({b"images": np.zeros((2, 3072), np.uint8), b"labels": [0, 1]}), "keys"),
        (pickle.dumps({b"data": np.zeros((2, 3072), np.float32), b"labels": [0, 1]}), "uint8"),
        (pickle.dumps({b"data": np.zeros((2, 1024), np.uint8), b"labels": [0, 1]}), "columns"),
        (pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}), "one per image"),
        (pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}), "0..9"),
        (pickle.dumps([1, 2, 3]), "not a dict"),
        (b"\x00garbage, not a pickle", "not a CIFAR pickle"),
    ],
    ids=["keys", "dtype", "columns", "labels_count", "labels_range", "list", "garbage"],
)
def test_malformed_batch_is_reported_with_the_layout(tmp_path, content, problem):
    write_cifar_batches(tmp_path)
    (tmp_path / "test_batch").write_bytes(content)
    with pytest.raises(DataLayoutError) as error:
        CIFAR10Dataset(tmp_path, "test")
    message = str(error.value)
    assert problem in message and "test_batch" in message and "Expected layout:" in message


class _Payload:
    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (os.mkdir, (self.target,))


def test_a_pickle_that_would_run_code_is_refused(tmp_path):
    write_cifar_batches(tmp_path)
    marker = tmp_path / "code_ran"
    (tmp_path / "test_batch").write_bytes(pickle.dumps({b"data": _Payload(str(marker))}))
    with pytest.raises(DataLayoutError, match="refusing to load"):
        CIFAR10Dataset(tmp_path, "test")
    assert not marker.exists()


def test_unknown_split_lists_the_choices(tmp_path):
    with pytest.raises(ValueError, match="train, test"):
        CIFAR10Dataset(tmp_path, "val")
