"""Training and evaluation loops, metrics, and the reliability machinery (failure policy,
checkpoints, resumable sampling, data parallelism) used by the experiments."""

from implicit_ham.training.checkpoint import CheckpointError, CheckpointStore, read_checkpoint, write_checkpoint
from implicit_ham.training.distributed import DistributedContext, unwrap
from implicit_ham.training.failures import FAILURE_KINDS, FAILURE_POLICIES, FailureEvent, FailureMonitor
from implicit_ham.training.guard import GuardedStep
from implicit_ham.training.loop import MetricSink, StepHooks, Task, TrainState, evaluate, fit, train_epoch
from implicit_ham.training.metrics import ConfusionMatrix
from implicit_ham.training.sampler import EpochBatchSampler

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
