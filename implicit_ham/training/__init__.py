"""Training and evaluation loops, metrics, and the reliability machinery (failure policy,
checkpoints, resumable sampling, data parallelism) used by the experiments."""

from .checkpoint import CheckpointError, CheckpointStore, read_checkpoint, write_checkpoint
from .distributed import DistributedContext, unwrap
from .failures import (
    FAILURE_KINDS,
    FAILURE_POLICIES,
    FailureEvent,
    FailureMonitor,
)
from .guard import GuardedStep
from .loop import MetricSink, StepHooks, Task, TrainState, evaluate, fit, train_epoch
from .metrics import ConfusionMatrix
from .sampler import EpochBatchSampler

__all__ = [
    "FAILURE_KINDS",
    "FAILURE_POLICIES",
    "CheckpointError",
    "CheckpointStore",
    "ConfusionMatrix",
    "DistributedContext",
    "EpochBatchSampler",
    "FailureEvent",
    "FailureMonitor",
    "GuardedStep",
    "MetricSink",
    "StepHooks",
    "Task",
    "TrainState",
    "evaluate",
    "fit",
    "read_checkpoint",
    "train_epoch",
    "unwrap",
    "write_checkpoint",
]
