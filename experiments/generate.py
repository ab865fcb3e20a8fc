"""Train and score one GAN configuration: ``python -m experiments.generate [overrides]``.

Arms: ``+arm=none|self_attention|nmf_one_step|nmf_unroll`` (the ``arm`` presets shared with
``experiments.train``). This command trains the twin-digit GAN of ``experiments.models.gan``
(global paths outside the context block); ``docs/generation.md`` and ``make generate`` use the
far-twin study instead (``experiments.generation.study``: local networks whose only global
path is the context block). ``python -m experiments.generate -m +experiment=generation`` still
sweeps the twin-digit arms. Running a command again skips finished jobs and resumes the others
from their newest checkpoints (also after a preemption: SIGUSR1 / SIGTERM / SIGINT make a job
checkpoint, write ``results.json`` with ``status: "preempted"`` and exit with status 128 +
signal number); a second command in a running job's directory is refused
(``JobLockedError``). The logic lives in
``experiments.generation.run``; this file only wires Hydra and turns the composed config into
the typed ``GenerateConfig`` it runs.
"""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from experiments.config.typed import as_container, typed_config
from experiments.engine.command import check_tasks_per_node, run_job
from experiments.engine.job_record import hydra_record
from experiments.engine.paths import check_write_paths
from experiments.engine.targets import check_targets, guard_hydra_callbacks
from experiments.generation.config import (
    GenerateConfig,
    check_generate_config,
    register_generate_configs,
)
from experiments.generation.run import run_generation

register_generate_configs()
guard_hydra_callbacks()  # before Hydra instantiates hydra.callbacks


@hydra.main(version_base="1.3", config_path="../conf", config_name="generate")
def main(cfg: DictConfig) -> float:
    """Run the job; return the final FID (for sweepers that minimise)."""
    config = typed_config(cfg, GenerateConfig)  # unset mandatory values fail here
    check_generate_config(config)  # before the job writes anything
    check_targets(as_container(config))  # no _target_ outside the allowlist runs
    hydra_cfg = HydraConfig.get()
    check_tasks_per_node(int(hydra_cfg.launcher.get("tasks_per_node", 1) or 1))
    output_dir = hydra_cfg.runtime.output_dir
    check_write_paths(as_container(config), output_dir)  # e.g. metrics.classifier_cache
    record = hydra_record(cfg)  # .hydra/, written by the job once it holds its lock
    results = run_job(lambda: run_generation(config, output_dir, record))
    return float(results["metrics"]["fid"])


if __name__ == "__main__":
    main()
