"""No-training study of a model's implicit layer: ``python -m experiments.grad_study [overrides]``.

Same config tree as experiments.train (``checkpoint=PATH`` studies a trained model). The logic
lives in ``experiments.studies.model_studies.run_grad_study``; this file only wires Hydra.
"""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from experiments.config.groups import TrainConfig, register_configs
from experiments.config.typed import as_container, typed_config
from experiments.engine.job_record import hydra_record, write_job_record
from experiments.engine.targets import check_targets, guard_hydra_callbacks
from experiments.studies.model_studies import run_grad_study

register_configs()
guard_hydra_callbacks()  # before Hydra instantiates hydra.callbacks


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    """Run the study and write its results into the job directory (every ``_target_`` checked
    against the allowlist first)."""
    config = typed_config(cfg, TrainConfig)
    check_targets(as_container(config))  # no _target_ outside the allowlist runs
    write_job_record(HydraConfig.get().runtime.output_dir, hydra_record(cfg))  # .hydra/
    run_grad_study(config, HydraConfig.get().runtime.output_dir)


if __name__ == "__main__":
    main()
