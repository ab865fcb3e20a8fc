"""No-training study of a model's implicit layer: ``python -m experiments.grad_study [overrides]``.

Same config tree as experiments.train (``checkpoint=PATH`` studies a trained model). The logic
lives in ``experiments.studies.model_studies.run_grad_study``; this file only wires Hydra.
"""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from experiments.config.groups import TrainConfig, register_configs
from experiments.config.typed import typed_config
from experiments.studies.model_studies import run_grad_study

register_configs()


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    """Run the study and write its results into the job directory."""
    run_grad_study(typed_config(cfg, TrainConfig), HydraConfig.get().runtime.output_dir)


if __name__ == "__main__":
    main()
