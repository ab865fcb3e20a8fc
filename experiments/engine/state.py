"""``TrainState``: where a training run stands at a step boundary (checkpointed, resumable)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor


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

    def finish_step(self, loss: Tensor | None) -> None:
        """Count a step's batch: its loss (0-d), or None when the failure policy skipped it."""
        if loss is None:
            self.skipped += 1
            self.consecutive_skipped += 1
        else:
            self.consecutive_skipped = 0
            self.loss_sum, self.loss_count = self.loss_sum + float(loss), self.loss_count + 1
        self.step, self.batch = self.step + 1, self.batch + 1

    def finish_epoch(self, metrics: dict[str, float]) -> None:
        """Move to the next epoch after ``metrics`` of the current one were computed."""
        self.metrics = dict(metrics)
        loss = metrics.get("val/loss")
        finite = loss is not None and math.isfinite(loss)
        if loss is not None and finite and (not self.best or loss < self.best["val/loss"]):
            self.best = {"val/loss": loss, "epoch": self.epoch}
        self.epoch, self.batch, self.loss_sum, self.loss_count = self.epoch + 1, 0, 0.0, 0
