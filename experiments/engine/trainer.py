"""``Trainer``: epochs of training steps, each followed by an evaluation, with callbacks around
them (``experiments.engine.callbacks``); resumable at any step boundary (``TrainState``).

Reading order of one epoch (``Trainer.fit``): position the loader, ``on_epoch_start``; per
batch: ``step(inputs, target, step)`` (a ``GuardedStep``: forward, backward, optimiser update),
``state.finish_step``, ``on_step_end``; then the epoch's train loss (summed over ranks), rank 0
evaluates, ``state.finish_epoch``, ``on_epoch_end``."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from experiments.engine.callbacks import Callback
from experiments.engine.distributed import DistributedContext
from experiments.engine.sampler import EpochBatchSampler
from experiments.engine.state import TrainState
from experiments.engine.task import Task, evaluate, to_device
from implicit_ham.plugins import check_positive_int
from implicit_ham.reliability.guard import unwrap

logger = logging.getLogger(__name__)

StepFn = Callable[[Tensor, Tensor, int], Tensor | None]
"""One optimisation step: ``(inputs, target, step) -> the batch's loss, or None (skipped)``."""


class Trainer:
    """Trains ``model`` on ``task`` by ``step`` and calls ``callbacks`` around the steps.

    Args:
        model: the model (possibly wrapped in DistributedDataParallel; rank 0 evaluates the
            module inside).
        task: the loss and the metrics (``Task``); its ``penalty.step`` is set before each
            batch.
        step: one optimisation step (``StepFn``), e.g. an
            ``implicit_ham.reliability.GuardedStep`` (the caller builds and closes it).
        device: where the batches go.
        dtype: floating-point inputs are cast to it (the model's, e.g. float64); None: left
            as they come.
        dist: the process group (default: one process). Under data parallelism the train loss
            is averaged over ranks, rank 0 evaluates and broadcasts the metrics.
        callbacks: called in list order at every hook (``experiments.engine.callbacks``).
    """

    def __init__(
        self,
        model: nn.Module,
        task: Task,
        step: StepFn,
        *,
        device: torch.device,
        dtype: torch.dtype | None = None,
        dist: DistributedContext | None = None,
        callbacks: Sequence[Callback] = (),
    ) -> None:
        self.model, self.task, self.step = model, task, step
        self.device, self.dtype = device, dtype
        self.dist = dist or DistributedContext(device=device)
        self.callbacks = list(callbacks)
        self.epochs = 0  # of the fit in progress

    def fit(
        self, train_batches: Any, val_batches: Any, epochs: int, state: TrainState | None = None
    ) -> dict[str, float]:
        """Train until ``epochs`` are done, evaluating after each; the last epoch's metrics.

        Starts from ``state`` (a resumed run's position; default the beginning) and updates it.
        When ``train_batches`` is a DataLoader over an ``EpochBatchSampler`` it is positioned
        at (``state.epoch``, ``state.batch``) each epoch; any other iterable can only start at
        an epoch boundary. ``val_batches`` None: no evaluation (a caller that measures its
        model itself, e.g. in a callback). Logs a line when an epoch's evaluation starts
        (``epoch N/M: evaluating``) and one with its metrics. ``epochs`` must be >= 1.
        """
        check_positive_int("Trainer.fit", "epochs", epochs)
        state = state if state is not None else TrainState()
        self.epochs = epochs
        self._call("on_fit_start", state)
        try:
            while state.epoch <= epochs:
                _position(train_batches, state)
                self._call("on_epoch_start", state, train_batches)
                start = time.perf_counter()
                self.train_epoch(train_batches, state)
                metrics = self._epoch_metrics(state, val_batches, start)
                state.finish_epoch(metrics)
                self._call("on_epoch_end", state, metrics)
        finally:
            self._call("on_fit_end", state)
        return state.metrics

    def train_epoch(self, batches: Iterable[tuple[Tensor, Tensor]], state: TrainState) -> float:
        """Train on ``batches`` (the rest of epoch ``state.epoch``), counting every step in
        ``state`` and calling ``on_step_end`` after it; the mean batch loss of this rank's
        epoch (batches before a resume included; NaN when every batch was skipped)."""
        self.model.train()
        for inputs, target in batches:
            if self.task.penalty is not None:
                self.task.penalty.step = state.step
            inputs = to_device(inputs, self.device, self.dtype)
            loss = self.step(inputs, target.to(self.device), state.step)
            state.finish_step(loss)
            self._call("on_step_end", state, loss)
        return _mean(state.loss_sum, state.loss_count)

    def _epoch_metrics(self, state: TrainState, val_batches: Any, start: float) -> dict[str, Any]:
        """The epoch's train loss over every rank, rank 0's evaluation, the epoch and its time
        (collective); no evaluation when ``val_batches`` is None."""
        loss_sum, loss_count = self.dist.sum([state.loss_sum, state.loss_count])
        val: dict[str, float] = {}
        if self.dist.is_main and val_batches is not None:  # the unwrapped model, on rank 0
            logger.info("epoch %d/%d: evaluating", state.epoch, self.epochs)
            val = evaluate(
                unwrap(self.model), val_batches, self.task, device=self.device, dtype=self.dtype
            )
        metrics = self.dist.broadcast(
            {
                "train/loss": _mean(loss_sum, loss_count),
                **val,
                "epoch": state.epoch,
                "epoch_time_s": time.perf_counter() - start,
            }
        )
        logger.info("epoch %d/%d  %s", state.epoch, self.epochs, _format(metrics))
        return metrics

    def _call(self, hook: str, state: TrainState, *args: Any) -> None:
        for callback in self.callbacks:
            getattr(callback, hook)(self, state, *args)


def _mean(total: float, count: float) -> float:
    """``total / count``; NaN when every batch of the epoch was skipped."""
    return total / count if count else float("nan")


def _position(batches: Any, state: TrainState) -> None:
    """Put an ``EpochBatchSampler`` loader at the state's epoch and batch."""
    sampler = getattr(batches, "batch_sampler", None)
    if isinstance(sampler, EpochBatchSampler):
        sampler.set_position(state.epoch, state.batch)
    elif state.batch:
        raise ValueError(
            f"cannot resume in the middle of epoch {state.epoch} (batch {state.batch}): the "
            "training batches are not a DataLoader over an EpochBatchSampler. Build the loader "
            "with experiments.engine.sampler.EpochBatchSampler."
        )


def _format(metrics: dict[str, float]) -> str:
    return "  ".join(
        f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
        for k, v in metrics.items()
        if k != "epoch"
    )
