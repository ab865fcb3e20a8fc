"""Segmentation and classification metrics from a confusion matrix (accumulated on device)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class ConfusionMatrix:
    """Accumulates a (num_classes, num_classes) confusion matrix; rows = target, cols = prediction.

    Pixels whose target equals ``ignore_index`` are skipped. Class 0 is background for
    segmentation: ``blob_accuracy`` is the accuracy on pixels whose target is >= 1.
    """

    num_classes: int
    ignore_index: int = 255
    matrix: Tensor | None = field(default=None, repr=False)

    def update(self, logits: Tensor, target: Tensor) -> None:
        """logits: (B, K, ...) scores; target: (B, ...) int64 labels."""
        pred = logits.argmax(1).reshape(-1)
        target = target.reshape(-1)
        keep = target != self.ignore_index
        if bool(((target < 0) | (target >= self.num_classes))[keep].any()):
            raise ValueError(
                f"target labels must lie in [0, {self.num_classes}) or equal ignore_index="
                f"{self.ignore_index}; got values {sorted(set(target[keep].tolist()))[:10]}"
            )
        index = target[keep] * self.num_classes + pred[keep]
        counts = torch.bincount(index, minlength=self.num_classes**2)
        counts = counts.reshape(self.num_classes, self.num_classes)
        self.matrix = counts if self.matrix is None else self.matrix + counts

    def _m(self) -> Tensor:
        if self.matrix is None:
            raise RuntimeError("ConfusionMatrix: no data; call update() first")
        return self.matrix.double()

    def accuracy(self) -> float:
        """Fraction of correctly classified (non-ignored) pixels or samples."""
        m = self._m()
        return float(m.diag().sum() / m.sum().clamp_min(1))

    def mean_iou(self) -> float:
        """Mean over classes present in target or prediction of TP / (TP + FP + FN)."""
        m = self._m()
        tp = m.diag()
        union = m.sum(0) + m.sum(1) - tp
        present = union > 0
        return float((tp[present] / union[present]).mean()) if bool(present.any()) else 0.0

    def blob_accuracy(self) -> float:
        """Accuracy on pixels whose target class is >= 1 (the foreground / blobs)."""
        m = self._m()[1:]
        return float(m[:, 1:].diag().sum() / m.sum().clamp_min(1))

    def summary(self, task: str) -> dict[str, float]:
        """The metrics of a task: segmentation -> pixel_acc, miou, blob_acc; else accuracy."""
        if task == "segmentation":
            return {
                "pixel_acc": self.accuracy(),
                "miou": self.mean_iou(),
                "blob_acc": self.blob_accuracy(),
            }
        return {"accuracy": self.accuracy()}
