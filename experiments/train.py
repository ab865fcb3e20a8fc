"""Train + evaluate one configuration: ``python -m experiments.train [overrides]``.

Sweeps: ``python -m experiments.train -m adjoint=unroll,one_step,implicit context.steps=1,3,6``.
Running the same command again resumes each job from its newest checkpoint (also after a
preemption: SIGUSR1 / SIGTERM / SIGINT make a job checkpoint, write ``results.json`` with
``status: "preempted"`` and exit with status 128 + signal number); data parallel:
``torchrun --standalone --nproc_per_node=2 -m experiments.train hydra.run.dir=DIR ...``.
The logic lives in ``experiments.engine.run.run_training``; this file only wires Hydra and turns
the composed config into the typed ``TrainConfig`` it runs.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from experiments.config.groups import TrainConfig, check_train_config, register_configs
from experiments.config.typed import as_container, typed_config
from experiments.engine.failure_log import logged_failure_counts
from experiments.engine.joblock import JobLockedError
from experiments.engine.preemption import PreemptedError
from experiments.engine.results import write_results
from experiments.engine.resume import ResumeConflictError
from experiments.engine.run import run_training
from experiments.engine.sinks import no_sinks
from experiments.engine.targets import check_targets, guard_hydra_callbacks

register_configs()
guard_hydra_callbacks()  # before Hydra instantiates hydra.callbacks


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float:
    """Run the job; return the validation loss (for sweepers that minimise)."""
    config = typed_config(cfg, TrainConfig)  # unset mandatory values fail here
    check_train_config(config)  # before the job writes anything
    check_targets(as_container(config))  # no _target_ outside the allowlist runs
    hydra_cfg = HydraConfig.get()
    _check_tasks_per_node(int(hydra_cfg.launcher.get("tasks_per_node", 1) or 1))
    output_dir = hydra_cfg.runtime.output_dir
    try:
        results = run_training(config, output_dir)
    except (ResumeConflictError, JobLockedError):
        raise  # the directory belongs to another run: leave its results.json as it is
    except PreemptedError as stopped:
        sys.exit(stopped.exit_code)  # results.json says "preempted"; rerun to resume
    except Exception as err:
        if os.environ.get("RANK", "0") != "0":
            raise  # under torchrun only rank 0 writes the job's files
        write_results(
            output_dir,
            {
                "status": "failed",
                "error": f"{type(err).__name__}: {err}",
                "config": as_container(config),
                **_logged_failures(config, output_dir),
            },
        )
        raise
    return float(results["metrics"]["val/loss"])


def _logged_failures(config: TrainConfig, output_dir: str) -> dict[str, Any]:
    """``{"failures": counts}`` of the events the job logged before it failed
    (``logged_failure_counts``); empty when its logger writes no files (nothing to count)."""
    if config.logger._target_ == f"{no_sinks.__module__}.{no_sinks.__qualname__}":
        return {}
    return {"failures": logged_failure_counts(output_dir)}


def _check_tasks_per_node(tasks: int) -> None:
    """Refuse several tasks per node without a distributed environment: each would be an
    independent world-size-1 copy of the job writing the same directory."""
    if tasks > 1 and int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        raise ValueError(
            f"hydra.launcher.tasks_per_node={tasks} but no distributed environment (WORLD_SIZE "
            "is unset): the tasks would be independent copies of one job writing the same "
            "directory. Set hydra.launcher.tasks_per_node=1, or launch the processes with "
            "torchrun (which sets WORLD_SIZE / RANK)."
        )


if __name__ == "__main__":
    main()
