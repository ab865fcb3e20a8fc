"""Requeue on preemption under submitit (``hydra/launcher=submitit_slurm`` / ``submitit_local``).

submitit runs a job as a pickled callable and, on its preemption signal (``USR2`` unless
``SUBMITIT_PREEMPT_SIGNAL`` says otherwise), calls the callable's ``checkpoint()`` hook, which
returns the ``DelayedSubmission`` to run next, dumps it and requeues the job. The hook of
hydra-submitit-launcher's launcher resubmits the same Hydra job (same overrides, same job
directory), which resumes from its newest checkpoint; ``TrainJob`` is the same hook for a job
submitted with submitit directly (``executor.submit(TrainJob(), cfg, output_dir)``).

Left alone, submitit's signal handler requeues from inside the signal handler, mid-step, and a
scheduler's other signals (SIGUSR1, SIGTERM) end the job as failed (``UncompletedJobError``).
Here instead, under submitit:

* ``preemption_signals`` adds submitit's preemption signal to ``reliability.preempt_signals``,
  so every one of them stops the run at the next step boundary with a checkpoint and
  ``results.json`` ``status: "preempted"`` (``experiments.engine.preemption``);
* then ``requeue`` hands over to submitit's own handler (``SignalHandler``), which calls the
  job's ``checkpoint()`` hook, counts a time-out against the submission's time-out budget,
  requeues (Slurm: ``scontrol requeue``; the local executor: exit status 3, rerun) and exits.

Outside submitit (no ``SUBMITIT_FOLDER`` in the environment) both are no-ops. On ranks other
than 0 submitit only logs (its rank 0 requeues the whole job).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

logger = logging.getLogger(__name__)

_STARTED = time.time()  # submitit's own handler measures the job's run time from here too


def under_submitit() -> bool:
    """Whether this process is a job started by submitit."""
    return "SUBMITIT_FOLDER" in os.environ


def preemption_signals(signals: list[signal.Signals]) -> list[signal.Signals]:
    """``signals`` plus submitit's preemption signal when running under submitit."""
    if not under_submitit():
        return signals
    from submitit import JobEnvironment

    usr = JobEnvironment._usr_sig()
    return signals if usr in signals else [*signals, usr]


def requeue(signum: int) -> None:
    """Under submitit, requeue this job through its ``checkpoint()`` hook and exit (submitit
    raises ``UncompletedJobError`` when the job cannot be requeued, e.g. after too many
    time-outs); a no-op otherwise."""
    if not under_submitit():
        return
    from submitit import JobEnvironment
    from submitit.core.job_environment import SignalHandler
    from submitit.core.utils import DelayedSubmission

    env = JobEnvironment()
    delayed = DelayedSubmission.load(env.paths.submitted_pickle)
    handler = SignalHandler(env, env.paths, delayed)
    handler._start_time = _STARTED  # the time-out test counts from the job's start
    logger.warning(
        "preempted by %s under submitit: requeueing job %s through its checkpoint() hook",
        signal.Signals(signum).name,
        env.job_id,
    )
    handler.checkpoint_and_try_requeue(signum)


class TrainJob:
    """``experiments.train``'s job as a submitit callable with the ``checkpoint()`` requeue
    hook: ``executor.submit(TrainJob(), cfg, output_dir)`` with the typed or composed config.

    On preemption the run checkpoints and submitit calls ``checkpoint()``, which resubmits the
    same call; the requeued job resumes in ``output_dir`` from that checkpoint.
    """

    def __call__(self, cfg: Any, output_dir: str | Path) -> dict[str, Any]:
        from experiments.config.groups import TrainConfig
        from experiments.config.typed import typed_config
        from experiments.engine.run import run_training

        config = typed_config(cfg, TrainConfig) if isinstance(cfg, DictConfig) else cfg
        return run_training(config, output_dir)

    def checkpoint(self, cfg: Any, output_dir: str | Path) -> Any:
        """The submission to run after a preemption: the same job, resumed from its
        checkpoints in ``output_dir``."""
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(TrainJob(), cfg, output_dir)
