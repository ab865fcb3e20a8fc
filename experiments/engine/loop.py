"""The training loop: epochs of guarded SGD steps, evaluation, checkpoint and metric callbacks,
an optional rich progress bar; resumable at any step boundary (``TrainState``)."""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from experiments.engine.distributed import DistributedContext
from experiments.engine.metrics import ConfusionMatrix
from experiments.engine.preemption import PreemptedError
from experiments.engine.sampler import EpochBatchSampler
from implicit_ham.plugins import check_positive_int
from implicit_ham.reliability.guard import GuardedStep, StepHooks, unwrap

if TYPE_CHECKING:
    from rich.progress import Progress

logger = logging.getLogger(__name__)


class MetricSink(Protocol):
    """Anything with ``log(metrics, step)`` (the diagnostics sinks satisfy it)."""

    def log(self, metrics: dict[str, Any], step: int) -> None: ...


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


@dataclass
class TrainState:
    """Where a training run stands at a step boundary: with the model, optimiser and scheduler
    states, everything a resumed run needs to continue exactly.

    Attributes:
        epoch: the epoch in progress (1-based; ``epochs + 1`` once training is over).
        batch: batches of that epoch already consumed (the data-loader position).
        step: optimisation steps attempted so far (skipped batches included).
        loss_sum, loss_count: sum and number of this epoch's batch losses (skipped excluded).
        skipped: batches skipped by the failure policy so far.
        consecutive_skipped: batches skipped in a row up to this step.
        metrics: the last finished epoch's metrics.
        best: the lowest validation loss so far and its epoch (empty before an evaluation).
    """

    epoch: int = 1
    batch: int = 0
    step: int = 0
    loss_sum: float = 0.0
    loss_count: int = 0
    skipped: int = 0
    consecutive_skipped: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    best: dict[str, float] = field(default_factory=dict)

    def state_dict(self) -> dict[str, Any]:
        """The state as plain data (checkpoint-safe)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> TrainState:
        """Inverse of ``state_dict``."""
        return cls(**state)

    def finish_epoch(self, metrics: dict[str, float]) -> None:
        """Move to the next epoch after ``metrics`` of the current one were computed."""
        self.metrics = dict(metrics)
        loss = metrics.get("val/loss")
        finite = loss is not None and math.isfinite(loss)
        if loss is not None and finite and (not self.best or loss < self.best["val/loss"]):
            self.best = {"val/loss": loss, "epoch": self.epoch}
        self.epoch, self.batch, self.loss_sum, self.loss_count = self.epoch + 1, 0, 0.0, 0


def _progress_bar(show: bool) -> AbstractContextManager[Progress | None]:
    """A transient rich progress bar when ``show`` (rich is imported only then), else None."""
    if not show:
        return nullcontext()
    try:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    except ImportError as err:
        raise ImportError(
            "fit(show_progress=True) draws its progress bar with rich, which is not installed; "
            "pip install rich (or implicit-ham[experiments]), or pass show_progress=False"
        ) from err
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        transient=True,
    )


def train_epoch(
    model: nn.Module,
    batches: Iterable[tuple[Tensor, Tensor]],
    task: Task,
    optimizer: torch.optim.Optimizer,
    *,
    device: torch.device,
    dtype: torch.dtype | None = None,
    state: TrainState | None = None,
    step_fn: Callable[[Tensor, Tensor, int], Tensor | None] | None = None,
    hooks: StepHooks | None = None,
    sinks: Sequence[MetricSink] = (),
    log_every: int = 10,
    on_step: Callable[[TrainState], None] | None = None,
    progress: Progress | None = None,
    progress_task: Any = None,
) -> dict[str, float]:
    """Train on ``batches`` (the rest of epoch ``state.epoch``), updating ``state`` after every
    batch and then calling ``on_step(state)`` (e.g. to checkpoint).

    Args:
        dtype: floating-point inputs are cast to it (None: left as they come).
        step_fn: ``(inputs, target, step) -> loss or None (skipped)`` running one optimisation
            step; default a ``GuardedStep`` with policy "warn" and ``hooks``.

    Returns:
        ``{"train/loss": mean batch loss of the epoch}`` (batches before a resume included;
        NaN when every batch was skipped).
    """
    model.train()
    state = state if state is not None else TrainState()
    own = step_fn is None
    runner = step_fn or GuardedStep(model, task, optimizer, hooks=hooks)
    try:
        for inputs, target in batches:
            if task.penalty is not None:
                task.penalty.step = state.step
            loss = runner(_to(inputs, device, dtype), target.to(device), state.step)
            if loss is None:
                state.skipped += 1
                state.consecutive_skipped += 1
            else:
                state.consecutive_skipped = 0
                state.loss_sum, state.loss_count = (
                    state.loss_sum + float(loss),
                    state.loss_count + 1,
                )
                if state.step % log_every == 0:
                    for sink in sinks:
                        sink.log({"train/loss": float(loss)}, state.step)
            state.step, state.batch = state.step + 1, state.batch + 1
            if on_step is not None:
                on_step(state)
            if progress is not None:
                progress.advance(progress_task)
    finally:
        if own and isinstance(runner, GuardedStep):
            runner.close()
    return {"train/loss": _mean(state.loss_sum, state.loss_count)}


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
        inputs, target = _to(inputs, device, dtype), target.to(device)
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


def fit(
    model: nn.Module,
    train_batches: Sequence[tuple[Tensor, Tensor]] | Any,
    val_batches: Sequence[tuple[Tensor, Tensor]] | Any,
    task: Task,
    optimizer: torch.optim.Optimizer,
    *,
    epochs: int,
    device: torch.device,
    dtype: torch.dtype | None = None,
    hooks: StepHooks | None = None,
    sinks: Sequence[MetricSink] = (),
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    show_progress: bool = False,
    log_every: int = 10,
    state: TrainState | None = None,
    step_fn: Callable[[Tensor, Tensor, int], Tensor | None] | None = None,
    checkpoint: Callable[[TrainState], None] | None = None,
    checkpoint_every: int = 0,
    dist: DistributedContext | None = None,
    preempt: Callable[[], int | None] | None = None,
    max_consecutive_skips: int = 0,
    max_skips: int = 0,
    stop_when: Callable[[dict[str, float]], bool] | None = None,
) -> dict[str, float]:
    """Train until ``epochs`` are done and evaluate after each; return the last epoch's metrics.

    Early stopping: when ``stop_when(metrics)`` is true after an epoch's evaluation, training
    is over at that epoch (``state.epoch`` becomes ``epochs + 1`` before the checkpoint, so a
    resumed run counts it finished; ``metrics["epoch"]`` says where it stopped).

    Starts from ``state`` (a resumed run's position; default the beginning). When
    ``train_batches`` is a DataLoader over an ``EpochBatchSampler`` it is positioned at
    (``state.epoch``, ``state.batch``) each epoch; any other iterable can only start at an
    epoch boundary. ``checkpoint(state)`` is called every ``checkpoint_every`` steps (0: never
    mid-epoch) and after every epoch (after the scheduler step and the evaluation). Under data
    parallelism (``dist``) the train loss is averaged over ranks and rank 0 evaluates.
    Floating-point inputs are cast to ``dtype`` (the model's, e.g. float64) unless it is None.
    ``hooks`` are used by the default ``step_fn`` (a ``GuardedStep`` with policy "warn"); a
    given ``step_fn`` carries its own.

    ``preempt()`` is asked after every step and after every epoch's checkpoint: a signal
    number (not None) stops the run there, after ``checkpoint(state)`` (unless one was just
    written), by raising ``experiments.engine.preemption.PreemptedError``; under data parallelism
    the ranks agree (any rank's signal stops them all at the same step). Once the last epoch
    is done a preemption is ignored (the run is finished).

    ``max_consecutive_skips`` / ``max_skips`` (0: no limit) bound the batches the failure
    policy may skip, in a row and in total: past either, ``SkipLimitError`` stops the run
    (a run that skips most batches trains nothing and would otherwise end "ok").

    Logs a line when an epoch's evaluation starts (``epoch N/M: evaluating``) and one with the
    epoch's metrics (``logging``) and, when ``show_progress``, a rich progress bar
    (needs ``rich``, part of the ``experiments`` extra). ``epochs`` must be >= 1: the returned
    metrics are the last epoch's evaluation.
    """
    check_positive_int("fit", "epochs", epochs)
    state = state if state is not None else TrainState()
    dist = dist or DistributedContext(device=device)
    runner = step_fn or GuardedStep(model, task, optimizer, hooks=hooks, dist=dist)

    def stop(current: TrainState, saved: bool) -> None:
        signum = dist.max_code((preempt() if preempt is not None else None) or 0)
        if signum and current.epoch <= epochs:
            if checkpoint is not None and not saved:
                checkpoint(current)
            raise PreemptedError(signum, current.step)

    def after_step(current: TrainState) -> None:
        _check_skips(current, max_consecutive_skips, max_skips)
        saved = False
        if checkpoint is not None and checkpoint_every and current.step % checkpoint_every == 0:
            checkpoint(current)
            saved = True
        stop(current, saved)

    try:
        with _progress_bar(show_progress) as progress:
            while state.epoch <= epochs:
                _position(train_batches, state)
                bar = (
                    None
                    if progress is None
                    else progress.add_task(
                        f"epoch {state.epoch}/{epochs}",
                        total=state.batch + len(train_batches),
                        completed=state.batch,
                    )
                )
                start = time.perf_counter()
                train_epoch(
                    model,
                    train_batches,
                    task,
                    optimizer,
                    device=device,
                    dtype=dtype,
                    state=state,
                    step_fn=runner,
                    sinks=sinks,
                    log_every=log_every,
                    on_step=after_step,
                    progress=progress,
                    progress_task=bar,
                )
                if scheduler is not None:
                    scheduler.step()
                loss_sum, loss_count = dist.sum([state.loss_sum, state.loss_count])
                if dist.is_main:
                    logger.info("epoch %d/%d: evaluating", state.epoch, epochs)
                val = (
                    evaluate(unwrap(model), val_batches, task, device=device, dtype=dtype)
                    if dist.is_main
                    else {}
                )
                metrics = dist.broadcast(
                    {
                        "train/loss": _mean(loss_sum, loss_count),
                        **val,
                        "epoch": state.epoch,
                        "epoch_time_s": time.perf_counter() - start,
                    }
                )
                if progress is not None and bar is not None:
                    progress.remove_task(bar)
                for sink in sinks:
                    sink.log(metrics, state.step)
                logger.info("epoch %d/%d  %s", state.epoch, epochs, _format(metrics))
                state.finish_epoch(metrics)
                if stop_when is not None and stop_when(metrics):
                    logger.info("epoch %d/%d: early stop", metrics["epoch"], epochs)
                    state.epoch = epochs + 1
                if checkpoint is not None:
                    checkpoint(state)
                stop(state, saved=True)
    finally:
        if step_fn is None and isinstance(runner, GuardedStep):
            runner.close()
    return state.metrics


class SkipLimitError(RuntimeError):
    """The failure policy skipped more batches than ``reliability.max_consecutive_skips`` (in a
    row) or ``reliability.max_skips`` (in total) allow."""


def _check_skips(state: TrainState, max_consecutive: int, max_total: int) -> None:
    if max_consecutive and state.consecutive_skipped >= max_consecutive:
        raise SkipLimitError(
            f"{state.consecutive_skipped} batches in a row skipped by the failure policy (up to "
            f"step {state.step - 1}; reliability.max_consecutive_skips={max_consecutive}): the "
            "model no longer trains. Lower the learning rate, check the data and "
            "tables/failures.jsonl, or raise the limit (0: none)."
        )
    if max_total and state.skipped >= max_total:
        raise SkipLimitError(
            f"{state.skipped} batches skipped by the failure policy in total (up to step "
            f"{state.step - 1}; reliability.max_skips={max_total}). Lower the learning rate, "
            "check the data and tables/failures.jsonl, or raise the limit (0: none)."
        )


def _to(inputs: Tensor, device: torch.device, dtype: torch.dtype | None) -> Tensor:
    """``inputs`` on ``device``, cast to ``dtype`` when both are floating point."""
    if dtype is None or not inputs.is_floating_point():
        return inputs.to(device)
    return inputs.to(device=device, dtype=dtype)


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
