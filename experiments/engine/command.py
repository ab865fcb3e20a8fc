"""What a command does with the outcome of its job (``experiments.train`` and the studies that
train through it): the job's own ``results.json`` stands for a finished or preempted
run; a failed run gets one written by ``failures_recorded``, while the job still holds its
directory's lock.

* ``ResumeConflictError`` / ``JobLockedError``: the directory belongs to another run (another
  config, or a live writer): re-raised, its ``results.json`` left as it is.
* ``CheckpointUnreadableError``: a checkpoint could not be read (an ``OSError``, e.g. a
  permission): re-raised naming the file and the error, every file left as it is (the run is
  not known to have failed; run the command again once the file is readable).
* ``PreemptedError``: the job checkpointed and wrote ``status: "preempted"``; the process
  exits with ``128 + signal number`` (``experiments.engine.preemption``).
* any other error raised while the job holds the lock: ``results.json`` with
  ``status: "failed"``, the error, the config and the failure counts of the events the job
  logged up to the error (under torchrun only rank 0 writes), then re-raised. An error before
  the lock is taken (a refused value, a held lock) writes nothing: the directory, which may be
  another run's, stays byte-identical.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from experiments.engine.checkpoint import CheckpointUnreadableError
from experiments.engine.failure_log import logged_failure_counts
from experiments.engine.joblock import JobLockedError
from experiments.engine.preemption import PreemptedError
from experiments.engine.results import write_results
from experiments.engine.resume import ResumeConflictError
from experiments.engine.sinks import no_sinks


def run_job(job: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``job()``'s results; a ``PreemptedError`` exits with its ``exit_code`` (the job wrote
    ``results.json`` "preempted"; rerun to resume), any other error propagates (the job wrote
    its failed ``results.json`` under its lock, ``failures_recorded``)."""
    try:
        return job()
    except PreemptedError as stopped:
        sys.exit(stopped.exit_code)


@contextmanager
def failures_recorded(
    output_dir: str | Path,
    config: dict[str, Any],
    *,
    logger_target: str,
    write: bool = True,
) -> Iterator[None]:
    """Write ``results.json`` ``status: "failed"`` when the body raises (module docstring);
    enter it only while holding the job directory's lock.

    Args:
        output_dir: the job directory. config: the config as plain data (what the failed
            ``results.json`` records).
        logger_target: the config's ``logger._target_``; with ``no_sinks`` (``logger=none``)
            the job logs no files, so a failed run's ``results.json`` has no ``failures``
            (else the counts of the events it logged: ``logged_failure_counts``).
        write: whether this process writes the job's files (rank 0 under torchrun).
    """
    try:
        yield
    except (ResumeConflictError, JobLockedError, PreemptedError, CheckpointUnreadableError):
        raise  # another run's directory, a preempted job that wrote its own results, or a
        # checkpoint that could not be read (the job's state is unknown, not failed)
    except Exception as err:
        if write:
            logged = logger_target != _NO_SINKS
            failures = {"failures": logged_failure_counts(output_dir)} if logged else {}
            write_results(
                output_dir,
                {
                    "status": "failed",
                    "error": f"{type(err).__name__}: {err}",
                    "config": config,
                    **failures,
                },
            )
        raise


def check_tasks_per_node(tasks: int) -> None:
    """Refuse several tasks per node (``hydra.launcher.tasks_per_node``) without a distributed
    environment: each would be an independent world-size-1 copy of the job writing the same
    directory."""
    if tasks > 1 and int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        raise ValueError(
            f"hydra.launcher.tasks_per_node={tasks} but no distributed environment (WORLD_SIZE "
            "is unset): the tasks would be independent copies of one job writing the same "
            "directory. Set hydra.launcher.tasks_per_node=1, or launch the processes with "
            "torchrun (which sets WORLD_SIZE / RANK)."
        )


_NO_SINKS = f"{no_sinks.__module__}.{no_sinks.__qualname__}"
