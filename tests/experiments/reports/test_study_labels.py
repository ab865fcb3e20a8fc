"""The names the study document gives its tasks agree with the presets' configs
(Hydra-composed), so a label cannot drift from the settings it names."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from experiments.config.groups import register_configs
from experiments.reports.study_data import PAPER_TASK, STRESS_TASK

CONF = Path(__file__).resolve().parents[3] / "conf"


def _config(*overrides: str) -> dict:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def test_the_task_names_are_the_presets_datasets() -> None:
    stress = _config("+experiment=adjoint_ablation")
    paper = _config("+experiment=paper_v3", "+arm=nmf_unroll")
    assert stress["data"]["_target_"].rsplit(".", 1)[-1] == STRESS_TASK
    assert paper["data"]["_target_"].rsplit(".", 1)[-1] == PAPER_TASK
