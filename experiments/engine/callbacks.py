"""What a ``Trainer`` does around its steps, one callback a concern: metric logging, the skip
limits, early stopping, checkpoints, preemption and the progress bar.

A callback overrides the hooks it needs; the trainer calls each hook on every callback in list
order, so the order is part of a run's behaviour: ``FlushAfterStep`` first, ``MetricLogging``
before ``Checkpointing``
(a checkpoint records how many rows each metric file has), ``SkipLimits`` and
``EarlyStopping`` before ``Checkpointing`` (the checkpoint holds their decision),
``Preemption`` after it (a preemption checkpoints unless a checkpoint was just written),
``ProgressBar`` last (``standard_callbacks`` builds that order)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from torch import Tensor

from experiments.engine.preemption import PreemptedError
from experiments.engine.state import TrainState

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from experiments.engine.trainer import Trainer

logger = logging.getLogger(__name__)


class MetricSink(Protocol):
    """Anything with ``log(metrics, step)`` (the diagnostics sinks satisfy it)."""

    def log(self, metrics: dict[str, Any], step: int) -> None: ...


class Callback:
    """Hooks of a ``Trainer`` run, each a no-op here. ``trainer.epochs`` is the number of epochs
    of the ``fit`` in progress; ``state`` is the run's ``TrainState``."""

    def on_fit_start(self, trainer: Trainer, state: TrainState) -> None:
        """Before the first epoch of ``fit``."""

    def on_epoch_start(self, trainer: Trainer, state: TrainState, batches: Any) -> None:
        """Before the epoch's batches (``batches``: the rest of the epoch, positioned)."""

    def on_step_end(self, trainer: Trainer, state: TrainState, loss: Tensor | None) -> None:
        """After a training step was counted in ``state`` (``state.step`` is already the next
        step's index); ``loss``: the batch's loss, None when the batch was skipped."""

    def on_epoch_end(self, trainer: Trainer, state: TrainState, metrics: dict[str, float]) -> None:
        """After the epoch's evaluation (``metrics``) and ``state.finish_epoch``."""

    def on_fit_end(self, trainer: Trainer, state: TrainState) -> None:
        """When ``fit`` returns or raises."""


class FlushAfterStep(Callback):
    """``flush()`` after every step, first of the callbacks: e.g. the failure rows the other
    ranks hold (``experiments.engine.failure_log.RankFailureLog.flush``, collective), written
    before the step's checkpoint counts them."""

    def __init__(self, flush: Callable[[], None]) -> None:
        self.flush = flush

    def on_step_end(self, trainer: Trainer, state: TrainState, loss: Tensor | None) -> None:
        """Flush."""
        self.flush()


class MetricLogging(Callback):
    """``train/loss`` of every ``every``-th step (skipped batches log nothing) and every epoch's
    metrics, to each of ``sinks`` at the step index."""

    def __init__(self, sinks: Sequence[MetricSink], every: int = 10) -> None:
        self.sinks, self.every = sinks, every

    def on_step_end(self, trainer: Trainer, state: TrainState, loss: Tensor | None) -> None:
        """Log the step's loss when due."""
        step = state.step - 1
        if loss is not None and step % self.every == 0:
            for sink in self.sinks:
                sink.log({"train/loss": float(loss)}, step)

    def on_epoch_end(self, trainer: Trainer, state: TrainState, metrics: dict[str, float]) -> None:
        """Log the epoch's metrics."""
        for sink in self.sinks:
            sink.log(metrics, state.step)


class SkipLimitError(RuntimeError):
    """The failure policy skipped more batches than ``reliability.max_consecutive_skips`` (in a
    row) or ``reliability.max_skips`` (in total) allow."""


class SkipLimits(Callback):
    """Bound the batches the failure policy may skip, in a row (``max_consecutive``) and in
    total (``max_total``; 0: no limit): past either, ``SkipLimitError`` stops the run (a run
    that skips most batches trains nothing and would otherwise end "ok")."""

    def __init__(self, max_consecutive: int = 0, max_total: int = 0) -> None:
        self.max_consecutive, self.max_total = max_consecutive, max_total

    def on_step_end(self, trainer: Trainer, state: TrainState, loss: Tensor | None) -> None:
        """Raise ``SkipLimitError`` once a limit is reached."""
        if self.max_consecutive and state.consecutive_skipped >= self.max_consecutive:
            raise SkipLimitError(
                f"{state.consecutive_skipped} batches in a row skipped by the failure policy "
                f"(up to step {state.step - 1}; reliability.max_consecutive_skips="
                f"{self.max_consecutive}): the model no longer trains. Lower the learning rate, "
                "check the data and tables/failures.jsonl, or raise the limit (0: none)."
            )
        if self.max_total and state.skipped >= self.max_total:
            raise SkipLimitError(
                f"{state.skipped} batches skipped by the failure policy in total (up to step "
                f"{state.step - 1}; reliability.max_skips={self.max_total}). Lower the learning "
                "rate, check the data and tables/failures.jsonl, or raise the limit (0: none)."
            )


class EarlyStopping(Callback):
    """Training is over at the first epoch whose ``metrics[key] >= at_least``: ``state.epoch``
    becomes ``epochs + 1`` (before the epoch's checkpoint, so a resumed run counts it
    finished; ``state.metrics["epoch"]`` says where it stopped)."""

    def __init__(self, at_least: float, key: str = "val/accuracy") -> None:
        self.at_least, self.key = at_least, key

    def on_epoch_end(self, trainer: Trainer, state: TrainState, metrics: dict[str, float]) -> None:
        """End the run when the metric reached the threshold."""
        if metrics.get(self.key, -1.0) >= self.at_least:
            logger.info("epoch %d/%d: early stop", metrics["epoch"], trainer.epochs)
            state.epoch = trainer.epochs + 1


class Checkpointing(Callback):
    """``save(state)`` every ``every`` steps (0: never mid-epoch) and after every epoch (after
    its evaluation); ``fresh`` says whether the last hook wrote one."""

    def __init__(self, save: Callable[[TrainState], None], every: int = 0) -> None:
        self.save, self.every = save, every
        self.fresh = False

    def on_step_end(self, trainer: Trainer, state: TrainState, loss: Tensor | None) -> None:
        """Save when the step is a multiple of ``every``."""
        self.fresh = bool(self.every) and state.step % self.every == 0
        if self.fresh:
            self.save(state)

    def on_epoch_end(self, trainer: Trainer, state: TrainState, metrics: dict[str, float]) -> None:
        """Save the finished epoch."""
        self.save(state)
        self.fresh = True


class Preemption(Callback):
    """``signal()`` is asked after every step and after every epoch's checkpoint: a signal
    number (not None) stops the run there, after a checkpoint (``checkpointing.save``, unless
    it just wrote one), by raising ``PreemptedError``. Under data parallelism the ranks agree
    (``trainer.dist.max_code``: any rank's signal stops them all at the same step). Once the
    last epoch is done a preemption is ignored (the run is finished)."""

    def __init__(
        self, signal: Callable[[], int | None], checkpointing: Checkpointing | None = None
    ) -> None:
        self.signal, self.checkpointing = signal, checkpointing

    def on_step_end(self, trainer: Trainer, state: TrainState, loss: Tensor | None) -> None:
        """Stop when a rank was signalled."""
        self._stop(trainer, state)

    def on_epoch_end(self, trainer: Trainer, state: TrainState, metrics: dict[str, float]) -> None:
        """Stop when a rank was signalled."""
        self._stop(trainer, state)

    def _stop(self, trainer: Trainer, state: TrainState) -> None:
        signum = trainer.dist.max_code(self.signal() or 0)
        if signum and state.epoch <= trainer.epochs:
            if self.checkpointing is not None and not self.checkpointing.fresh:
                self.checkpointing.save(state)
            raise PreemptedError(signum, state.step)


class ProgressBar(Callback):
    """A transient rich progress bar of each epoch's batches (rich is imported only here)."""

    def __init__(self) -> None:
        try:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
        except ImportError as err:
            raise ImportError(
                "the progress bar is drawn with rich, which is not installed; pip install rich "
                "(or implicit-ham[experiments]), or set progress=false"
            ) from err
        self.progress: Progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            transient=True,
        )
        self.bar: TaskID | None = None

    def on_fit_start(self, trainer: Trainer, state: TrainState) -> None:
        """Show the bar."""
        self.progress.start()

    def on_epoch_start(self, trainer: Trainer, state: TrainState, batches: Any) -> None:
        """A bar for the epoch, at the batches already done."""
        self.bar = self.progress.add_task(
            f"epoch {state.epoch}/{trainer.epochs}",
            total=state.batch + len(batches),
            completed=state.batch,
        )

    def on_step_end(self, trainer: Trainer, state: TrainState, loss: Tensor | None) -> None:
        """Advance the bar."""
        if self.bar is not None:
            self.progress.advance(self.bar)

    def on_epoch_end(self, trainer: Trainer, state: TrainState, metrics: dict[str, float]) -> None:
        """Remove the epoch's bar."""
        if self.bar is not None:
            self.progress.remove_task(self.bar)
            self.bar = None

    def on_fit_end(self, trainer: Trainer, state: TrainState) -> None:
        """Hide the bar."""
        self.progress.stop()


def standard_callbacks(
    *,
    sinks: Sequence[MetricSink] = (),
    log_every: int = 10,
    checkpoint: Checkpointing | None = None,
    preempt: Callable[[], int | None] | None = None,
    skip_limits: SkipLimits | None = None,
    stop_at_accuracy: float | None = None,
    progress: bool = False,
) -> list[Callback]:
    """The callbacks of a training job in the order their effects need (module docstring):
    logging, skip limits, early stopping, checkpoints, preemption, progress; each left out
    when not asked for."""
    callbacks: list[Callback | None] = [
        MetricLogging(sinks, log_every) if sinks else None,
        skip_limits,
        None if stop_at_accuracy is None else EarlyStopping(stop_at_accuracy),
        checkpoint,
        None if preempt is None else Preemption(preempt, checkpoint),
        ProgressBar() if progress else None,
    ]
    return [callback for callback in callbacks if callback is not None]
