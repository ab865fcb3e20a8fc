"""What a training loop of implicit layers needs and no generic loop gives: ``GuardedStep``
(one optimisation step under a failure policy) and ``FailureMonitor`` (every failure event
counted by kind and layer). Use them in any loop: plain PyTorch, Lightning, the experiments'
engine (see docs/reliability.md)."""

from implicit_ham.reliability.divergence import LossDivergedError, LossDivergence
from implicit_ham.reliability.failures import (
    ACTION_MEANINGS,
    FAILURE_KINDS,
    FAILURE_MEANINGS,
    FAILURE_POLICIES,
    FailureEvent,
    FailureMonitor,
)
from implicit_ham.reliability.guard import GuardedStep, StepHooks

__all__ = [
    "ACTION_MEANINGS",
    "FAILURE_KINDS",
    "FAILURE_MEANINGS",
    "FAILURE_POLICIES",
    "FailureEvent",
    "FailureMonitor",
    "GuardedStep",
    "LossDivergedError",
    "LossDivergence",
    "StepHooks",
]
