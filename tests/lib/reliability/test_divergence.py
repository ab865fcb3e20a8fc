"""Finite divergence of the training loss (issue 47 item 9): ``LossDivergence`` against a
re-implementation of its rule, and ``GuardedStep`` recording it as a ``loss_diverged`` failure
event under each policy (before, a loss that climbed from 1 to 5e3 without going non-finite
was no event at all). Empty batches are refused by name (item 10)."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from implicit_ham.reliability import LossDivergedError, LossDivergence
from implicit_ham.reliability.failures import FailureMonitor
from implicit_ham.reliability.guard import GuardedStep


def _flags(losses: list[float], factor: float, steps: int, smoothing: float) -> list[bool]:
    """The rule written out: a step is above when its loss exceeds factor x the lowest
    exponential moving average of the losses before it; flagged after ``steps`` in a row."""
    out, averages, run = [], [], 0
    for loss in losses:
        bar = factor * min(averages) if averages and min(averages) > 0 else None
        run = run + 1 if bar is not None and loss > bar else 0
        out.append(run >= steps)
        previous = averages[-1] if averages else None
        averages.append(loss if previous is None else smoothing * previous + (1 - smoothing) * loss)
    return out


def test_flags_match_the_rule_on_a_healthy_and_a_diverging_curve() -> None:
    generator = torch.Generator().manual_seed(0)
    noise = torch.rand(200, generator=generator, dtype=torch.float64)
    healthy = [float(1.1 * 0.98**t * (0.5 + n)) for t, n in enumerate(noise)]  # noisy descent
    diverging = healthy[:50] + [float(1e3 * (1 + n)) for n in noise[:30]]
    for losses in (healthy, diverging):
        check = LossDivergence(factor=10.0, steps=5, smoothing=0.9)
        got = [check.update(loss) for loss in losses]
        assert got == _flags(losses, 10.0, 5, 0.9)
    assert not any(_flags(healthy, 10.0, 5, 0.9))  # a noisy descent to 0.02 is never flagged
    assert _flags(diverging, 10.0, 5, 0.9).index(True) == 54  # the 5th step above


def test_state_round_trips_and_bad_settings_are_refused() -> None:
    check = LossDivergence(factor=3.0, steps=2)
    for loss in (1.0, 0.5, 9.0):
        check.update(loss)
    restored = LossDivergence(factor=3.0, steps=2)
    restored.load_state_dict(check.state_dict())
    assert restored.update(9.0) is check.update(9.0) is True
    for bad in ({"factor": 1.0}, {"factor": float("inf")}, {"steps": 0}, {"smoothing": 1.0}):
        with pytest.raises(ValueError, match="LossDivergence"):
            LossDivergence(**bad)  # type: ignore[arg-type]


class ScriptedLoss:
    """A task whose loss is the next value of a script (times a zero-gradient term of the
    logits, so that backward runs through the model)."""

    def __init__(self, values: list[float]) -> None:
        self.values = iter(values)

    def loss(self, logits: Tensor, target: Tensor) -> Tensor:
        return logits.sum() * 0 + next(self.values)


@pytest.mark.parametrize(
    ("policy", "action"),
    [("warn", "continued"), ("skip_batch", "skipped"), ("fallback", "skipped")],
)
def test_guarded_step_records_divergence_under_the_policy(policy: str, action: str) -> None:
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = FailureMonitor()
    losses = [1.0, 0.9, 50.0, 60.0, 70.0]  # above 10 x 0.99 (the lowest average) from index 2
    step = GuardedStep(model, ScriptedLoss(losses), optimizer, policy=policy, monitor=monitor,
                       divergence=LossDivergence(factor=10.0, steps=2))  # fmt: skip
    outcomes = [step(torch.ones(4, 3), torch.zeros(4, dtype=torch.long), t) for t in range(5)]
    assert monitor.counts == {("loss_diverged", "(loss)", action): 2}  # the 2nd, 3rd step above
    skipped = [o is None for o in outcomes]
    assert skipped == ([False] * 5 if action == "continued" else [False, False, False, True, True])


def test_guarded_step_raises_on_divergence_under_raise() -> None:
    model = nn.Linear(3, 2)
    step = GuardedStep(model, ScriptedLoss([1.0, 50.0, 60.0]),
                       torch.optim.SGD(model.parameters(), lr=0.1), policy="raise",
                       divergence=LossDivergence(factor=10.0, steps=2))  # fmt: skip
    batch = (torch.ones(4, 3), torch.zeros(4, dtype=torch.long))
    step(*batch, 0)
    step(*batch, 1)
    with pytest.raises(LossDivergedError, match=r"step 2: the training loss 60 .* 2 steps"):
        step(*batch, 2)


def test_empty_batch_is_refused_by_name_not_counted_as_a_nonfinite_loss() -> None:
    model = nn.Linear(3, 2)
    monitor = FailureMonitor()
    step = GuardedStep(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1),
                       policy="skip_batch", monitor=monitor)  # fmt: skip
    with pytest.raises(ValueError, match=r"step 7: an empty batch \(inputs of shape \(0, 3\)\)"):
        step(torch.ones(0, 3), torch.zeros(0, dtype=torch.long), 7)
    assert monitor.counts == {}
