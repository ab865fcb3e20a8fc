"""Train + evaluate one configuration: ``python -m experiments.train [overrides]``.

Sweeps: ``python -m experiments.train -m adjoint=unroll,one_step,implicit context.steps=1,3,6``.
Running the same command again resumes each job from its newest checkpoint (also after a
preemption: SIGUSR1 / SIGTERM / SIGINT make a job checkpoint, write ``results.json`` with
``status: "preempted"`` and exit with status 128 + signal number); data parallel:
``torchrun --standalone --nproc_per_node=2 -m experiments.train hydra.run.dir=DIR ...``.
The logic lives in ``experiments.engine.run.run_training``, which checks every value before the
job writes anything; this file only wires Hydra, turns the composed config into the typed
``TrainConfig`` it runs and checks what is Hydra's (the launcher's ``tasks_per_node``).
"""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from experiments.config.groups import TrainConfig, register_configs
from experiments.config.typed import typed_config
from experiments.engine.command import check_tasks_per_node, run_job
from experiments.engine.job_record import hydra_record
from experiments.engine.run import run_training
from experiments.engine.targets import guard_hydra_callbacks

register_configs()
guard_hydra_callbacks()  # before Hydra instantiates hydra.callbacks


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float:
    """Run the job; return the validation loss (for sweepers that minimise)."""
    config = typed_config(cfg, TrainConfig)  # unset mandatory values fail here
    hydra_cfg = HydraConfig.get()
    check_tasks_per_node(int(hydra_cfg.launcher.get("tasks_per_node", 1) or 1))
    output_dir = hydra_cfg.runtime.output_dir
    record = hydra_record(cfg)  # .hydra/, written by the job once it holds its lock
    results = run_job(lambda: run_training(config, output_dir, record))
    return float(results["metrics"]["val/loss"])


if __name__ == "__main__":
    main()
