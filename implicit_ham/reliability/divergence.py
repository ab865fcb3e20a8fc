"""``LossDivergence``: a training loss that diverges while staying finite.

A learning rate far too large drives the loss up by orders of magnitude without ever making it
NaN / inf (``optim.lr=1000``: a validation loss of 5242 from 1.1, no non-finite value, no
failure event). The check smooths the per-step loss with an exponential moving average
(``smoothing``), keeps the lowest average so far, and flags every step whose loss exceeds
``factor`` times that lowest average for ``steps`` steps in a row. The average starts at the
first loss, so a loss ``factor`` times above its initial value is caught as well; the
smoothing keeps one lucky low batch from setting the bar. ``GuardedStep`` records each flagged
step as a ``loss_diverged`` failure event under its policy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from implicit_ham._core.validation import check_positive_int


class LossDivergedError(RuntimeError):
    """The training loss diverged (``LossDivergence``) under ``on_failure=raise``."""


@dataclass
class LossDivergence:
    """Per-process divergence check of the training loss (one ``update`` per step).

    Args:
        factor: a step's loss above ``factor`` x the lowest smoothed loss so far counts as
            above (> 1).
        steps: consecutive steps above before a step is flagged (>= 1).
        smoothing: weight of the previous average in the moving average, in [0, 1).
    """

    factor: float = 10.0
    steps: int = 10
    smoothing: float = 0.9
    average: float | None = None
    lowest: float | None = None
    above: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.factor, bool) or not isinstance(self.factor, (int, float)):
            raise ValueError(f"LossDivergence: factor must be a number > 1, got {self.factor!r}")
        if not 1 < self.factor < math.inf:
            raise ValueError(f"LossDivergence: factor must be a number > 1, got {self.factor!r}")
        check_positive_int("LossDivergence", "steps", self.steps)
        if isinstance(self.smoothing, bool) or not 0 <= self.smoothing < 1:
            raise ValueError(
                f"LossDivergence: smoothing must lie in [0, 1), got {self.smoothing!r}"
            )

    def update(self, loss: float) -> bool:
        """Account for a step's finite ``loss``; True when this step is flagged (its loss and
        the ``steps - 1`` before it were above ``threshold``)."""
        bar = self.threshold
        self.above = self.above + 1 if bar is not None and loss > bar else 0
        self.average = (
            loss
            if self.average is None
            else self.smoothing * self.average + (1 - self.smoothing) * loss
        )
        self.lowest = self.average if self.lowest is None else min(self.lowest, self.average)
        return self.above >= self.steps

    @property
    def threshold(self) -> float | None:
        """``factor`` x the lowest smoothed loss so far; None before the first step or when
        that is <= 0 (a loss that can be negative has no scale to compare against)."""
        if self.lowest is None or self.lowest <= 0:
            return None
        return self.factor * self.lowest

    def state_dict(self) -> dict[str, Any]:
        """The running state (checkpoint-safe)."""
        return {"average": self.average, "lowest": self.lowest, "above": self.above}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state saved by ``state_dict``."""
        self.average, self.lowest, self.above = state["average"], state["lowest"], state["above"]
