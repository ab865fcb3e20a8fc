"""Training and evaluation loops and metrics used by the experiments."""

from .loop import MetricSink, StepHooks, Task, evaluate, fit, train_epoch
from .metrics import ConfusionMatrix

__all__ = ["ConfusionMatrix", "MetricSink", "StepHooks", "Task", "evaluate", "fit", "train_epoch"]
