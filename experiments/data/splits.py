"""The ``data`` config group's targets: each builds (train set, validation set, task).

``conf/data/<name>.yaml`` instantiates one of these by ``_target_``; its fields are generated
from the function's signature (``experiments.config.signatures``).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.utils.data import Dataset, TensorDataset

from experiments.data import LegendSegDataset, make_dataset, task_of
from experiments.data.digit_canvas import SEG_CLASSES, CanvasStyle, digit_canvases
from experiments.data.factory import TaskInfo
from experiments.data.far_twins import (
    FarTwinsDataset,
    mask_right_cell,
    masked_cell_loss,
    pairing_canvases,
)


@dataclass(frozen=True)
class Splits:
    """A dataset's training and validation sets and its task; ``test`` a held-out set that
    training never sees (None where the dataset has none; the engine trains on ``train`` and
    evaluates on ``val``, a study evaluates ``test`` itself)."""

    train: Dataset
    val: Dataset
    task: TaskInfo
    test: Dataset | None = None


def legend_seg(
    train_size: int = 1024,
    val_size: int = 128,
    image_size: int = 64,
    num_classes: int = 4,
    seed: int = 0,
) -> Splits:
    """The embedded task: segment blobs by matching their texture to a legend strip;
    materialised as tensors (images (N, 3, S, S), masks (N, S, S))."""
    train = LegendSegDataset(
        train_size, split="train", image_size=image_size, num_classes=num_classes, seed=seed
    )
    val = LegendSegDataset(
        val_size, split="val", image_size=image_size, num_classes=num_classes, seed=seed
    )
    return Splits(
        TensorDataset(*train.materialize()),
        TensorDataset(*val.materialize()),
        task_of("legend_seg", num_classes=num_classes),
    )


def digits(val_fraction: float = 0.2, seed: int = 0) -> Splits:
    """scikit-learn's 8x8 digits, split by class-stratified ``val_fraction``."""
    return Splits(
        make_dataset("digits", split="train", val_fraction=val_fraction, seed=seed),
        make_dataset("digits", split="val", val_fraction=val_fraction, seed=seed),
        task_of("digits", val_fraction=val_fraction, seed=seed),
    )


def digit_seg(
    train_size: int = 512,
    val_size: int = 128,
    digits_per_image: int = 5,
    max_classes: int = 2,
    occlusion_min: int = 4,
    occlusion_max: int = 8,
    noise: float = 0.2,
    seed: int = 0,
    scan_seed: int | None = None,
    test_size: int = 0,
) -> Splits:
    """The paper-regime task (``experiments.data.digit_canvas``): 64x64 canvases of occluded,
    noisy real digits from 1..``max_classes`` classes per image, every pixel labelled
    (background 0, digit d as 1 + d); images (N, 1, 64, 64), masks (N, 64, 64).

    ``seed`` draws the canvases; ``scan_seed`` (None: the fixed train / val scan split) splits
    the scans three ways (``digit_canvas.scan_split``), and then ``test_size`` > 0 canvases of
    the test scans form ``Splits.test`` (a replicate of the paper-regime study passes its data
    seed as both)."""
    if test_size and scan_seed is None:
        raise ValueError(
            f"digit_seg: test_size={test_size} needs a scan_seed (the fixed scan split has no "
            "test scans); set data.scan_seed=<data seed> or data.test_size=0"
        )
    style = CanvasStyle(digits_per_image, max_classes, (occlusion_min, occlusion_max), noise)
    test = digit_canvases(test_size, "test", style, seed, scan_seed) if test_size else None
    return Splits(
        TensorDataset(*digit_canvases(train_size, "train", style, seed, scan_seed)),
        TensorDataset(*digit_canvases(val_size, "val", style, seed, scan_seed)),
        TaskInfo("segmentation", SEG_CLASSES, 1, None, (64, 64)),
        None if test is None else TensorDataset(*test),
    )


def far_twins_masked(
    train_size: int = 4096, val_size: int = 1024, val_fraction: float = 0.2, seed: int = 0
) -> Splits:
    """Far-twin canvases (``experiments.data.far_twins``) with the right digit's cell blanked:
    items (masked canvas, canvas), both (1, 32, 32); the task (kind "masked_cell") scores the
    prediction of the right digit's cell (``masked_cell_loss``). Train and val canvases are
    built from disjoint digit images (``val_fraction`` of each class held out)."""
    sets = [
        FarTwinsDataset(split, size, val_fraction=val_fraction, seed=seed).canvases
        for split, size in (("train", train_size), ("val", val_size))
    ]
    train, val = (TensorDataset(mask_right_cell(c), c) for c in sets)
    return Splits(train, val, TaskInfo("masked_cell", 1, 1, None, (32, 32), loss=masked_cell_loss))


def far_twins_pairing(
    train_size: int = 4096, val_size: int = 1024, val_fraction: float = 0.2, seed: int = 0
) -> Splits:
    """The pairing check of generation v3 (``experiments.data.far_twins.pairing_canvases``):
    items (canvas (1, 32, 32), label), label 1 for a real far-twin canvas and 0 for a
    recombined one whose two real digits are of different classes, half of each in both sets
    (val accuracy = balanced accuracy); the task (kind "pairing", 2 classes) is scored by
    cross-entropy and accuracy. Train and val canvases are built from disjoint digit scans."""
    train, val = (
        TensorDataset(*pairing_canvases(split, size, val_fraction, seed))
        for split, size in (("train", train_size), ("val", val_size))
    )
    return Splits(train, val, TaskInfo("pairing", 2, 1, None, (32, 32)))


def cifar10(root: str) -> Splits:
    """CIFAR-10 from its python-pickle folder ``root``; validation is the test split."""
    return Splits(
        make_dataset("cifar10", root=root, split="train"),
        make_dataset("cifar10", root=root, split="test"),
        task_of("cifar10"),
    )


def voc2012(root: str, size: int = 128, resize_mode: str = "center_crop") -> Splits:
    """PASCAL VOC 2012 segmentation from ``root`` at ``size`` x ``size``."""
    options = {"size": size, "resize_mode": resize_mode}
    return Splits(
        make_dataset("voc2012", root=root, split="train", **options),
        make_dataset("voc2012", root=root, split="val", **options),
        task_of("voc2012", **options),
    )


def _h3(task: str, num_examples: int | None, num_test_examples: int | None, seed: int) -> Splits:
    from experiments.data.h3_synthetics import h3_synthetic

    data = h3_synthetic(
        task, num_examples=num_examples, num_test_examples=num_test_examples, seed=seed
    )
    config = data.config

    def final(split: TensorDataset) -> TensorDataset:
        inputs, targets = split.tensors
        return TensorDataset(inputs, targets[:, -1].contiguous())

    return Splits(
        final(data.train),
        final(data.test),
        TaskInfo(
            "classification",
            config.vocab_size,
            1,
            None,
            None,
            length=int(data.train.tensors[0].shape[1]),
            vocab_size=config.vocab_size,
        ),
    )


def h3_induction(
    num_examples: int | None = None, num_test_examples: int | None = None, seed: int = 0
) -> Splits:
    """The H3 induction-head task at the published configuration
    (``experiments.data.h3_synthetics.PUBLISHED``; vocabulary 20, 31 input tokens, 5000 train /
    500 test sequences): token ids (N, 31) int64 and the final position's next token (N,),
    the reported metric (a classification over the vocabulary). ``val`` is the test split.
    None keeps a published size."""
    return _h3("induction_head", num_examples, num_test_examples, seed)


def h3_associative_recall(
    num_examples: int | None = None, num_test_examples: int | None = None, seed: int = 0
) -> Splits:
    """The H3 associative-recall task at the published configuration (vocabulary 10, 22 input
    tokens, 5000 train / 500 test), scored on the final position as ``h3_induction``."""
    return _h3("associative_recall", num_examples, num_test_examples, seed)


def mnist1d(shuffle_seq: bool = False, num_samples: int = 5000, seed: int = 42) -> Splits:
    """MNIST-1D (``experiments.data.mnist_1d``): sequences (N, 1, 40) float32 and digit labels;
    the package's 4000 / 1000 split, ``val`` the test split; ``shuffle_seq`` its fixed
    permutation of the 40 positions."""
    from experiments.data.mnist_1d import LENGTH, NUM_CLASSES, mnist1d_splits

    data = mnist1d_splits(shuffle_seq=shuffle_seq, num_samples=num_samples, seed=seed)
    return Splits(
        data.train, data.test, TaskInfo("classification", NUM_CLASSES, 1, None, None, LENGTH)
    )
