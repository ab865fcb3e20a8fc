"""What a command does with the outcome of its job (``experiments.train``,
``experiments.generate``): the job's own ``results.json`` stands for a finished or preempted
run; a failed run gets one written here, after the error.

* ``ResumeConflictError`` / ``JobLockedError``: the directory belongs to another run (another
  config, or a live writer): re-raised, its ``results.json`` left as it is.
* ``PreemptedError``: the job checkpointed and wrote ``status: "preempted"``; the process
  exits with ``128 + signal number`` (``experiments.engine.preemption``).
* any other error: ``results.json`` with ``status: "failed"``, the error, the config and the
  failure counts of the events the job logged up to the error (under torchrun only rank 0
  writes), then re-raised.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from experiments.engine.joblock import JobLockedError
from experiments.engine.preemption import PreemptedError
from experiments.engine.results import write_results
from experiments.engine.resume import ResumeConflictError
from experiments.engine.sinks import no_sinks

FailureCounts = Callable[[str | Path], dict[str, Any]]


def run_job(
    job: Callable[[], dict[str, Any]],
    output_dir: str | Path,
    config: dict[str, Any],
    *,
    logger_target: str,
    failure_counts: FailureCounts,
) -> dict[str, Any]:
    """``job()``'s results, with its errors handled as the module docstring says.

    Args:
        job: runs the job, returns its results.
        output_dir: the job directory. config: the config as plain data (what the failed
            ``results.json`` records).
        logger_target: the config's ``logger._target_``; with ``no_sinks`` (``logger=none``)
            the job logs no files, so a failed run's ``results.json`` has no ``failures``.
        failure_counts: the counts of the job's logged events, from its directory
            (``experiments.engine.failure_log.logged_failure_counts`` or a command's variant).
    """
    try:
        return job()
    except (ResumeConflictError, JobLockedError):
        raise  # the directory belongs to another run: leave its results.json as it is
    except PreemptedError as stopped:
        sys.exit(stopped.exit_code)  # results.json says "preempted"; rerun to resume
    except Exception as err:
        if os.environ.get("RANK", "0") != "0":
            raise  # under torchrun only rank 0 writes the job's files
        failures = {} if logger_target == _NO_SINKS else {"failures": failure_counts(output_dir)}
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
