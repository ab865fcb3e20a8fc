"""A plain training loop: epochs of SGD steps, evaluation, callbacks, sinks, rich progress."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from torch import Tensor, nn

from .metrics import ConfusionMatrix

logger = logging.getLogger(__name__)


class MetricSink(Protocol):
    """Anything with ``log(metrics, step)`` (the diagnostics sinks satisfy it)."""

    def log(self, metrics: dict[str, Any], step: int) -> None: ...


@dataclass(frozen=True)
class Task:
    """What the model predicts: "segmentation" (per pixel) or "classification"."""

    kind: str
    num_classes: int
    ignore_index: int = 255

    def loss(self, logits: Tensor, target: Tensor) -> Tensor:
        """Cross-entropy; logits (B, K, ...) and target (B, ...) int64."""
        return F.cross_entropy(logits, target, ignore_index=self.ignore_index)


@dataclass
class StepHooks:
    """Optional callbacks around each optimisation step (e.g. the diagnostics callback).

    ``after_backward(step)`` runs when gradients exist, ``after_step(step)`` after the update.
    """

    after_backward: Callable[[int], None] | None = None
    after_step: Callable[[int], None] | None = None


def train_epoch(
    model: nn.Module,
    batches: Iterable[tuple[Tensor, Tensor]],
    task: Task,
    optimizer: torch.optim.Optimizer,
    *,
    device: torch.device,
    step: int,
    hooks: StepHooks | None = None,
    sinks: Sequence[MetricSink] = (),
    log_every: int = 10,
    progress: Progress | None = None,
    progress_task: Any = None,
) -> tuple[int, dict[str, float]]:
    """One pass over ``batches``; returns the new global step and the epoch's mean loss."""
    model.train()
    hooks = hooks or StepHooks()
    total, count = torch.zeros((), device=device), 0
    for inputs, target in batches:
        inputs, target = inputs.to(device), target.to(device)
        optimizer.zero_grad(set_to_none=True)
        loss = task.loss(model(inputs), target)
        loss.backward()
        if hooks.after_backward is not None:
            hooks.after_backward(step)
        optimizer.step()
        if hooks.after_step is not None:
            hooks.after_step(step)
        total, count = total + loss.detach(), count + 1
        if step % log_every == 0:
            for sink in sinks:
                sink.log({"train/loss": float(loss.detach())}, step)
        step += 1
        if progress is not None:
            progress.advance(progress_task)
    return step, {"train/loss": float(total / max(count, 1))}


@torch.no_grad()
def evaluate(
    model: nn.Module, batches: Iterable[tuple[Tensor, Tensor]], task: Task, *, device: torch.device
) -> dict[str, float]:
    """Metrics of ``model`` on ``batches`` in eval mode (keys prefixed with ``val/``)."""
    model.eval()
    confusion = ConfusionMatrix(task.num_classes, task.ignore_index)
    total, count = 0.0, 0
    for inputs, target in batches:
        inputs, target = inputs.to(device), target.to(device)
        logits = model(inputs)
        total += float(task.loss(logits, target)) * len(inputs)
        count += len(inputs)
        confusion.update(logits, target)
    metrics = {f"val/{k}": v for k, v in confusion.summary(task.kind).items()}
    metrics["val/loss"] = total / max(count, 1)
    return metrics


def fit(
    model: nn.Module,
    train_batches: Sequence[tuple[Tensor, Tensor]] | Any,
    val_batches: Sequence[tuple[Tensor, Tensor]] | Any,
    task: Task,
    optimizer: torch.optim.Optimizer,
    *,
    epochs: int,
    device: torch.device,
    hooks: StepHooks | None = None,
    sinks: Sequence[MetricSink] = (),
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    show_progress: bool = True,
    log_every: int = 10,
) -> dict[str, float]:
    """Train for ``epochs`` and evaluate after each; return the last epoch's metrics.

    Logs one line per epoch (``logging``) and, when ``show_progress``, a rich progress bar.
    """
    step, metrics = 0, {}
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        disable=not show_progress,
        transient=True,
    ) as progress:
        for epoch in range(1, epochs + 1):
            bar = progress.add_task(f"epoch {epoch}/{epochs}", total=len(train_batches))
            start = time.perf_counter()
            step, train_metrics = train_epoch(
                model,
                train_batches,
                task,
                optimizer,
                device=device,
                step=step,
                hooks=hooks,
                sinks=sinks,
                log_every=log_every,
                progress=progress,
                progress_task=bar,
            )
            if scheduler is not None:
                scheduler.step()
            metrics = {
                **train_metrics,
                **evaluate(model, val_batches, task, device=device),
                "epoch": epoch,
                "epoch_time_s": time.perf_counter() - start,
            }
            progress.remove_task(bar)
            for sink in sinks:
                sink.log(metrics, step)
            logger.info("epoch %d/%d  %s", epoch, epochs, _format(metrics))
    return metrics


def _format(metrics: dict[str, float]) -> str:
    return "  ".join(
        f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
        for k, v in metrics.items()
        if k != "epoch"
    )
