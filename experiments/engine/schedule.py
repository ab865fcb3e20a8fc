"""The paper's poly learning-rate schedule, set per optimisation step from the step number alone.

Being a function of the step (not a stateful scheduler stepped per epoch), it needs no
checkpointed state of its own: a resumed run sets the same learning rates as an uninterrupted
one. Each parameter group's starting rate is kept in the group as ``initial_lr`` (the key
torch's schedulers use), which the optimiser's state dict carries through checkpoints.
"""

from __future__ import annotations

import torch

from implicit_ham.plugins import check_positive_int
from implicit_ham.reliability.guard import StepHooks


def poly_factor(step: int, total: int, power: float) -> float:
    """``(1 - step / total) ** power``: 1 at step 0, falling to 0 at ``total``."""
    return max(1.0 - step / total, 0.0) ** power


def set_poly_lr(optimizer: torch.optim.Optimizer, step: int, total: int, power: float) -> None:
    """Set every group's learning rate to its ``initial_lr`` times ``poly_factor``."""
    factor = poly_factor(step, total, power)
    for group in optimizer.param_groups:
        group["lr"] = group["initial_lr"] * factor


def poly_lr_hooks(
    hooks: StepHooks, optimizer: torch.optim.Optimizer, total: int, power: float
) -> StepHooks:
    """``hooks`` with the poly schedule added: after each backward pass of step t (before the
    update) the learning rates become ``initial_lr * (1 - t / total) ** power``.

    Args:
        hooks: existing hooks (kept: the schedule runs after their ``after_backward``).
        optimizer: its groups' current ``lr`` becomes ``initial_lr`` where that is not set yet
            (a resumed optimiser already carries it).
        total: the run's optimisation steps (epochs x batches per epoch).
        power: the exponent (0.9 in the paper).
    """
    check_positive_int("poly_lr_hooks", "total", total)
    if not power > 0:
        raise ValueError(f"lr_poly_power must be > 0 (the paper uses 0.9), got {power!r}")
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])
    before = hooks.after_backward

    def after_backward(step: int) -> None:
        if before is not None:
            before(step)
        set_poly_lr(optimizer, step, total, power)

    return StepHooks(after_backward=after_backward, after_step=hooks.after_step)
