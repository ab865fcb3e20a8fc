"""The digit classifier of the sample metrics: one 8 x 8 far-twin cell -> its class.

A multilayer perceptron 64 -> ``hidden`` -> ``features`` -> 10 (ReLU); its ``features`` layer
is the feature space of FID / KID / precision / recall (``samples``), the way Inception's pool
layer is for ImageNet FID. It is trained once per data seed on the cells of the far-twins
**train** scans of that seed (``experiments.data.digits.split_indices``, the split
``FarTwinsDataset`` uses), deterministically (its own seed, one thread), and its accuracy on the
val scans' cells is recorded. ``cached_classifier`` keeps it under the study's output folder,
keyed by its settings and the data seed, so every job of a seed scores with the same classifier.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from experiments.data.digits import NUM_CLASSES, DigitsDataset

logger = logging.getLogger(__name__)

PIXELS = 64


@dataclass(frozen=True)
class ClassifierSettings:
    """What a classifier is (its cache key): layer sizes, training and the scan split."""

    hidden: int = 128
    features: int = 64
    epochs: int = 60
    batch_size: int = 64
    lr: float = 3e-3
    weight_decay: float = 1e-4
    seed: int = 0
    val_fraction: float = 0.2

    def digest(self) -> str:
        """Short hash of the settings."""
        payload = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:10]


class CellClassifier(nn.Module):
    """Cells (B, 8, 8) in [0, 1] -> logits (B, 10); ``features`` -> (B, features)."""

    def __init__(self, hidden: int = 128, features: int = 64) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Flatten(), nn.Linear(PIXELS, hidden), nn.ReLU(), nn.Linear(hidden, features),
            nn.ReLU(),
        )  # fmt: skip
        self.head = nn.Linear(features, NUM_CLASSES)

    def features(self, cells: Tensor) -> Tensor:
        """Cells (B, 8, 8) -> penultimate features (B, features)."""
        if cells.ndim != 3 or cells.shape[1:] != (8, 8):
            raise ValueError(f"CellClassifier: expected cells (B, 8, 8), got {tuple(cells.shape)}")
        return self.body(cells)

    def forward(self, cells: Tensor) -> Tensor:
        """Cells (B, 8, 8) -> logits (B, 10)."""
        return self.head(self.features(cells))


def scan_cells(split: str, data_seed: int, val_fraction: float = 0.2) -> tuple[Tensor, Tensor]:
    """The cells (N, 8, 8) and classes (N,) of ``split``'s scans under ``data_seed``."""
    scans = DigitsDataset(split, val_fraction, data_seed)
    return scans.images[:, 0], scans.labels


@torch.no_grad()
def accuracy(classifier: CellClassifier, cells: Tensor, labels: Tensor) -> float:
    """Share of ``cells`` (N, 8, 8) classified as ``labels`` (N,)."""
    classifier.eval()
    return float((classifier(cells).argmax(1) == labels).double().mean())


def train_classifier(settings: ClassifierSettings, data_seed: int) -> tuple[CellClassifier, dict]:
    """Train a classifier on ``data_seed``'s train scans (one thread, seeded; torch's global
    RNG and thread count are restored). Returns it (eval mode) and its record: the val scans'
    accuracy, the train scans' accuracy, the training time."""
    train_x, train_y = scan_cells("train", data_seed, settings.val_fraction)
    val_x, val_y = scan_cells("val", data_seed, settings.val_fraction)
    threads = torch.get_num_threads()
    start = time.perf_counter()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(settings.seed)
            classifier = CellClassifier(settings.hidden, settings.features)
            optimizer = torch.optim.AdamW(
                classifier.parameters(), lr=settings.lr, weight_decay=settings.weight_decay
            )
            for _ in range(settings.epochs):
                classifier.train()
                for batch in torch.randperm(len(train_x)).split(settings.batch_size):
                    loss = nn.functional.cross_entropy(classifier(train_x[batch]), train_y[batch])
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
    finally:
        torch.set_num_threads(threads)
    record = {
        "val_accuracy": accuracy(classifier, val_x, val_y),
        "train_accuracy": accuracy(classifier, train_x, train_y),
        "train_time_s": time.perf_counter() - start,
        "data_seed": data_seed,
        "settings": asdict(settings),
    }
    return classifier, record


def cached_classifier(
    folder: Path, data_seed: int, settings: ClassifierSettings | None = None
) -> tuple[CellClassifier, dict]:
    """The classifier of ``settings`` (default ones) and ``data_seed`` from
    ``folder/cell-classifier-<digest>-d<seed>.pt``, trained and written (atomically) when it is
    not there; with its record (``train_classifier``)."""
    settings = settings or ClassifierSettings()
    path = folder / f"cell-classifier-{settings.digest()}-d{data_seed}.pt"
    classifier = CellClassifier(settings.hidden, settings.features)
    if path.exists():
        state = torch.load(path, map_location="cpu", weights_only=False)
        classifier.load_state_dict(state["model"])
        return classifier.eval(), state["record"]
    classifier, record = train_classifier(settings, data_seed)
    logger.info("cell classifier (data seed %d): val accuracy %.4f, trained in %.1f s",
                data_seed, record["val_accuracy"], record["train_time_s"])  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    torch.save({"model": classifier.state_dict(), "record": record}, partial)
    os.replace(partial, path)
    return classifier, record
