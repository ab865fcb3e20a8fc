"""``Trainer`` and its callbacks: the hooks' order, a checkpoint per preemption (none twice),
early stopping before the epoch's checkpoint, and the numbers of a plain SGD run against a
hand-written loop."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor, nn

from experiments.engine.callbacks import (
    Callback,
    Checkpointing,
    EarlyStopping,
    MetricLogging,
    Preemption,
    standard_callbacks,
)
from experiments.engine.preemption import PreemptedError
from experiments.engine.state import TrainState
from experiments.engine.task import Task
from experiments.engine.trainer import StepFn, Trainer

CPU = torch.device("cpu")


def _batches(n: int, seed: int = 0) -> list[tuple[Tensor, Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(4, 3, generator=gen), torch.randint(0, 2, (4,), generator=gen))
            for _ in range(n)]  # fmt: skip


def _sgd_step(model: nn.Module, task: Task, lr: float = 0.1) -> StepFn:
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)

    def step(inputs: Tensor, target: Tensor, index: int) -> Tensor:
        optimizer.zero_grad()
        loss = task.loss(model(inputs), target)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return step


class Recorder(Callback):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def on_fit_start(self, trainer: Trainer, state: TrainState) -> None:
        self.calls.append("fit_start")

    def on_epoch_start(self, trainer: Trainer, state: TrainState, batches: object) -> None:
        self.calls.append(f"epoch_start {state.epoch}")

    def on_step_end(self, trainer: Trainer, state: TrainState, loss: Tensor | None) -> None:
        self.calls.append(f"step_end {state.step}")

    def on_epoch_end(self, trainer: Trainer, state: TrainState, metrics: dict[str, float]) -> None:
        self.calls.append(f"epoch_end {metrics['epoch']}")

    def on_fit_end(self, trainer: Trainer, state: TrainState) -> None:
        self.calls.append("fit_end")


def test_the_hooks_run_in_order_and_fit_end_runs_after_an_error() -> None:
    model, task = nn.Linear(3, 2), Task("classification", 2)
    recorder = Recorder()
    trainer = Trainer(model, task, _sgd_step(model, task), device=CPU, callbacks=[recorder])
    trainer.fit(_batches(2), _batches(1), epochs=2)
    assert recorder.calls == ["fit_start", "epoch_start 1", "step_end 1", "step_end 2",
                              "epoch_end 1", "epoch_start 2", "step_end 3", "step_end 4",
                              "epoch_end 2", "fit_end"]  # fmt: skip

    def failing(inputs: Tensor, target: Tensor, index: int) -> Tensor:
        raise RuntimeError("boom")

    recorder = Recorder()
    with pytest.raises(RuntimeError, match="boom"):
        Trainer(model, task, failing, device=CPU, callbacks=[recorder]).fit(
            _batches(2), _batches(1), epochs=1
        )
    assert recorder.calls == ["fit_start", "epoch_start 1", "fit_end"]


def test_the_trainer_matches_a_hand_written_loop() -> None:
    """Same SGD steps, same epoch metrics as a plain loop over the same batches."""
    torch.manual_seed(0)
    model, task = nn.Linear(3, 2), Task("classification", 2)
    reference = copy.deepcopy(model)
    train, val = _batches(5), _batches(2, seed=1)
    logged: list[tuple[dict[str, float], int]] = []

    class Sink:
        def log(self, metrics: dict[str, float], step: int) -> None:
            logged.append((dict(metrics), step))

    trainer = Trainer(model, task, _sgd_step(model, task), device=CPU,
                      callbacks=[MetricLogging([Sink()], every=2)])  # fmt: skip
    metrics = trainer.fit(train, val, epochs=2)

    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    losses = []
    for _ in range(2):
        epoch_losses = []
        for inputs, target in train:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(reference(inputs), target)
            loss.backward()
            optimizer.step()
            epoch_losses.append(float(loss.detach()))
        losses.append(epoch_losses)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p, q)
    assert metrics["train/loss"] == sum(losses[1]) / 5
    with torch.no_grad():
        val_loss = sum(float(nn.functional.cross_entropy(reference(x), y)) * 4 for x, y in val)
    assert metrics["val/loss"] == pytest.approx(val_loss / 8, rel=1e-12)
    train_rows = [(m["train/loss"], s) for m, s in logged if "epoch" not in m]
    flat = [loss for epoch in losses for loss in epoch]
    assert train_rows == [(flat[s], s) for s in range(0, 10, 2)]
    assert [s for m, s in logged if "epoch" in m] == [5, 10]


def test_without_validation_batches_the_trainer_trains_and_evaluates_nothing() -> None:
    """``fit(train, None, ...)``: the same steps as with an evaluation, metrics without any
    ``val/`` key (the studies that measure their model themselves)."""
    torch.manual_seed(0)
    model, task = nn.Linear(3, 2), Task("classification", 2)
    reference = copy.deepcopy(model)
    metrics = Trainer(model, task, _sgd_step(model, task), device=CPU).fit(_batches(3), None, 1)
    Trainer(reference, task, _sgd_step(reference, task), device=CPU).fit(
        _batches(3), _batches(1), 1
    )
    assert sorted(metrics) == ["epoch", "epoch_time_s", "train/loss"]
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p, q)


@pytest.mark.parametrize(
    ("every", "signal_at", "saves"), [(3, 3, [3]), (3, 4, [3, 4]), (0, 2, [2])]
)
def test_a_preemption_checkpoints_once(every: int, signal_at: int, saves: list[int]) -> None:
    """Signalled after step ``signal_at``: the run stops there with a checkpoint, the one the
    step's own ``checkpoint_every`` wrote when there was one (never two of the same step)."""
    model, task = nn.Linear(3, 2), Task("classification", 2)
    saved: list[int] = []
    checkpointing = Checkpointing(lambda state: saved.append(state.step), every)
    state = TrainState()
    preemption = Preemption(lambda: 10 if state.step == signal_at else None, checkpointing)
    trainer = Trainer(model, task, _sgd_step(model, task), device=CPU,
                      callbacks=[checkpointing, preemption])  # fmt: skip
    with pytest.raises(PreemptedError) as stopped:
        trainer.fit(_batches(8), _batches(1), epochs=2, state=state)
    assert stopped.value.step == signal_at == state.step
    assert saved == saves


def test_a_preemption_after_the_last_epoch_is_ignored() -> None:
    model, task = nn.Linear(3, 2), Task("classification", 2)
    saved: list[int] = []
    checkpointing = Checkpointing(lambda state: saved.append(state.epoch), 0)
    state = TrainState()
    preemption = Preemption(lambda: 10 if state.epoch > 1 else None, checkpointing)
    trainer = Trainer(model, task, _sgd_step(model, task), device=CPU,
                      callbacks=[checkpointing, preemption])  # fmt: skip
    trainer.fit(_batches(2), _batches(1), epochs=1, state=state)
    assert saved == [2] and state.epoch == 2


def test_early_stopping_ends_the_run_before_the_epoch_checkpoint() -> None:
    model, task = nn.Linear(3, 2), Task("classification", 2)
    saved: list[tuple[int, float]] = []
    callbacks = standard_callbacks(
        checkpoint=Checkpointing(lambda s: saved.append((s.epoch, s.metrics["epoch"]))),
        stop_at_accuracy=0.0,
    )
    assert [type(c) for c in callbacks] == [EarlyStopping, Checkpointing]
    trainer = Trainer(model, task, _sgd_step(model, task), device=CPU, callbacks=callbacks)
    metrics = trainer.fit(_batches(2), _batches(1), epochs=5)
    assert metrics["epoch"] == 1
    assert saved == [(6, 1)]  # the checkpoint counts the run finished
