"""make_dataset / task_of: the described task matches what the built dataset yields."""

from __future__ import annotations

import pytest
import torch
from helpers.data_writers import write_cifar_batches, write_voc_tree

from experiments.data import (
    DATASET_NAMES,
    CIFAR10Dataset,
    DataLayoutError,
    DigitsDataset,
    LegendSegDataset,
    VOCSegmentation,
    make_dataset,
    task_of,
)


def _check_task_against_items(name, dataset, **kw):
    task = task_of(name, **kw)
    for index in range(min(3, len(dataset))):
        image, target = dataset[index]
        assert image.shape[0] == task.in_channels
        if task.image_size is not None:
            assert tuple(image.shape[1:]) == task.image_size
        if task.kind == "classification":
            assert isinstance(target, int) and 0 <= target < task.num_classes
        else:
            assert target.shape == image.shape[1:]
            valid = target[target != task.ignore_index]
            assert torch.all((valid >= 0) & (valid < task.num_classes))
    return task


def test_builtin_datasets(tmp_path):
    legend = make_dataset("legend_seg", split="val", size=4, num_classes=3, image_size=48, seed=2)
    assert isinstance(legend, LegendSegDataset) and len(legend) == 4 and legend.split == "val"
    task = _check_task_against_items(
        "legend_seg", legend, size=4, num_classes=3, image_size=48, seed=2
    )
    assert (task.kind, task.num_classes, task.ignore_index) == ("segmentation", 4, 255)
    assert len(make_dataset("legend_seg")) == 1000
    digits = make_dataset("digits", split="val", seed=1)
    assert isinstance(digits, DigitsDataset)
    task = _check_task_against_items("digits", digits, seed=1)
    assert (task.kind, task.num_classes, task.in_channels) == ("classification", 10, 1)


def test_disk_datasets(tmp_path):
    write_cifar_batches(tmp_path / "cifar" / "cifar-10-batches-py")
    cifar = make_dataset("cifar10", root=tmp_path / "cifar", split="test")
    assert isinstance(cifar, CIFAR10Dataset) and len(cifar) == 4
    assert _check_task_against_items("cifar10", cifar).num_classes == 10
    write_voc_tree(tmp_path / "voc", {"train": ["a", "b"], "val": ["c"]})
    voc = make_dataset("voc2012", root=str(tmp_path / "voc"), split="val", size=(16, 24))
    assert isinstance(voc, VOCSegmentation) and len(voc) == 1
    task = _check_task_against_items("voc2012", voc, size=(16, 24))
    assert (task.num_classes, task.ignore_index, task.image_size) == (21, 255, (16, 24))
    assert task_of("voc2012").image_size is None


def test_names_options_and_roots_are_checked():
    assert set(DATASET_NAMES) == {"legend_seg", "digits", "cifar10", "voc2012"}
    with pytest.raises(KeyError, match="legend_seg, digits, cifar10, voc2012"):
        make_dataset("mnist")
    with pytest.raises(KeyError, match="valid choices"):
        task_of("mnist")
    with pytest.raises(TypeError, match=r"num_class.*valid options: size, image_size, num_classes"):
        make_dataset("legend_seg", num_class=3)
    with pytest.raises(TypeError, match=r"valid options: \(none\)"):
        task_of("cifar10", size=32)
    with pytest.raises(ValueError, match="takes no root"):
        make_dataset("digits", root="/data")
    with pytest.raises(DataLayoutError) as error:
        make_dataset("voc2012")
    assert "needs a root" in str(error.value) and "SegmentationClass/" in str(error.value)
