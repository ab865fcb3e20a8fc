"""What a training job predicts and how it is scored: ``Task`` (the loss) and ``evaluate`` (the
validation metrics)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from experiments.engine.metrics import ConfusionMatrix

logger = logging.getLogger(__name__)


class LossPenalty(Protocol):
    """A term added to the training loss (``experiments.models.jacobian_penalty``): ``step``
    is set before each batch, ``term()`` gives the term of that step or None."""

    step: int

    def term(self) -> Tensor | None: ...


@dataclass(frozen=True)
class Task:
    """What the model predicts: "segmentation" (per pixel) or "classification"; ``penalty``
    (optional) adds its term to the training loss (``penalty=jacobian`` in the config);
    ``loss_fn`` (optional, ``TaskInfo.loss``): the task's own loss instead of cross-entropy, and
    then ``evaluate`` reports ``val/loss`` alone (no confusion matrix)."""

    kind: str
    num_classes: int
    ignore_index: int = 255
    penalty: LossPenalty | None = None
    loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None

    def loss(self, logits: Tensor, target: Tensor) -> Tensor:
        """Cross-entropy (logits (B, K, ...), target (B, ...) int64) or ``loss_fn``. With
        gradient enabled (a training step, not ``evaluate``), plus the penalty's term when it
        has one."""
        if self.loss_fn is not None:
            loss = self.loss_fn(logits, target)
        else:
            loss = F.cross_entropy(logits, target, ignore_index=self.ignore_index)
        if self.penalty is None or not torch.is_grad_enabled():
            return loss
        extra = self.penalty.term()
        return loss if extra is None else loss + extra


def to_device(inputs: Tensor, device: torch.device, dtype: torch.dtype | None) -> Tensor:
    """``inputs`` on ``device``, cast to ``dtype`` when both are floating point."""
    if dtype is None or not inputs.is_floating_point():
        return inputs.to(device)
    return inputs.to(device=device, dtype=dtype)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Iterable[tuple[Tensor, Tensor]],
    task: Task,
    *,
    device: torch.device,
    dtype: torch.dtype | None = None,
) -> dict[str, float]:
    """Metrics of ``model`` on ``batches`` in eval mode (keys prefixed with ``val/``);
    floating-point inputs are cast to ``dtype`` unless it is None.

    A sample whose (floating-point) input holds NaN / inf is left out of every metric, counted
    in ``val/nonfinite_inputs`` and named in a warning with the count: its logits would be
    non-finite and its metrics meaningless. ValueError when every sample is such."""
    model.eval()
    confusion = ConfusionMatrix(task.num_classes, task.ignore_index)
    total, count, dropped = 0.0, 0, 0
    for inputs, target in batches:
        inputs, target = to_device(inputs, device, dtype), target.to(device)
        if inputs.is_floating_point():
            finite = torch.isfinite(inputs.reshape(len(inputs), -1)).all(1)
            if not bool(finite.all()):
                dropped += int((~finite).sum())
                inputs, target = inputs[finite], target[finite]
                if not len(inputs):
                    continue
        logits = model(inputs)
        total += float(task.loss(logits, target)) * len(inputs)
        count += len(inputs)
        if task.loss_fn is None:
            confusion.update(logits, target)
    if dropped and not count:
        raise ValueError(
            f"evaluation: all {dropped} validation samples have NaN / inf inputs; no metric can "
            "be computed. Check the validation data"
        )
    metrics: dict[str, float] = {}
    if task.loss_fn is None:
        metrics = {f"val/{k}": v for k, v in confusion.summary(task.kind).items()}
    metrics["val/loss"] = total / max(count, 1)
    if dropped:
        logger.warning("evaluation: %d sample(s) with NaN / inf inputs left out of the metrics "
                       "(%d evaluated); check the validation data", dropped, count)  # fmt: skip
        metrics["val/nonfinite_inputs"] = float(dropped)
    return metrics
